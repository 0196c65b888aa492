// virtio-vsock wire format (virtio 1.2 §5.10) and the checks every packet the
// guest sends goes through before the device acts on it.
//
// Pure functions over plain bytes: no queues, no sockets, so they are unit
// tested and fuzzed directly.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torpor::vsock {

inline constexpr uint64_t kHostCid = 2;
// CIDs 0..2 are reserved (hypervisor, local, host); 0xffffffff is "any".
inline constexpr uint64_t kMinGuestCid = 3;
inline constexpr uint64_t kMaxGuestCid = 0xfffffffeu;

inline constexpr uint16_t kTypeStream = 1;

enum Op : uint16_t {
  kOpInvalid = 0,
  kOpRequest = 1,
  kOpResponse = 2,
  kOpRst = 3,
  kOpShutdown = 4,
  kOpRw = 5,
  kOpCreditUpdate = 6,
  kOpCreditRequest = 7,
};

// SHUTDOWN flags, from the sender's point of view.
inline constexpr uint32_t kShutdownRcv = 1;   // sender will receive no more
inline constexpr uint32_t kShutdownSend = 2;  // sender will send no more
inline constexpr uint32_t kShutdownBoth = kShutdownRcv | kShutdownSend;

inline constexpr uint32_t kEventTransportReset = 0;

// Largest payload of one packet, both directions (Linux never sends more:
// VIRTIO_VSOCK_MAX_PKT_BUF_SIZE).
inline constexpr uint32_t kMaxPayload = 64 * 1024;

#pragma pack(push, 1)
struct Header {
  uint64_t src_cid;
  uint64_t dst_cid;
  uint32_t src_port;
  uint32_t dst_port;
  uint32_t len;
  uint16_t type;
  uint16_t op;
  uint32_t flags;
  uint32_t buf_alloc;
  uint32_t fwd_cnt;
};
#pragma pack(pop)
static_assert(sizeof(Header) == 44);

struct Event {
  uint32_t id;
};
static_assert(sizeof(Event) == 4);

// Why a packet from the guest is not acted on. Everything but kOk is dropped;
// the device answers RST only to well-formed packets for unknown connections.
enum class Verdict {
  kOk,
  kShort,        // the chain holds less than a header
  kBadSrcCid,    // not the guest's own CID (spoofing another machine)
  kBadDstCid,    // not addressed to the host
  kBadType,      // not a stream (no SEQPACKET: the feature is not offered)
  kBadOp,        // unknown operation
  kOversized,    // len > kMaxPayload
  kTruncated,    // len larger than the payload the chain carries
  kStrayPayload  // len != 0 on an operation that carries no data
};

const char* verdict_name(Verdict v);
const char* op_name(uint16_t op);

// Checks a header the guest put on its tx queue; chain_bytes is everything
// the chain offers to the device (header included).
Verdict check_tx_packet(const Header& h, uint64_t chain_bytes, uint64_t guest_cid);

// A header from the host to the guest (type stream); buf_alloc and fwd_cnt
// are filled in when the packet is written, from the connection's counters.
Header host_header(uint64_t guest_cid, uint32_t host_port, uint32_t guest_port, uint16_t op,
                   uint32_t flags = 0, uint32_t len = 0);

}  // namespace torpor::vsock
