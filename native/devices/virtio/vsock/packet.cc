#include "devices/virtio/vsock/packet.h"

namespace torpor::vsock {

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kOk: return "ok";
    case Verdict::kShort: return "shorter than a header";
    case Verdict::kBadSrcCid: return "source CID is not the guest's";
    case Verdict::kBadDstCid: return "destination CID is not the host";
    case Verdict::kBadType: return "socket type is not stream";
    case Verdict::kBadOp: return "unknown operation";
    case Verdict::kOversized: return "payload larger than 64 KiB";
    case Verdict::kTruncated: return "payload length beyond the descriptor chain";
    case Verdict::kStrayPayload: return "payload on an operation that carries none";
  }
  return "?";
}

const char* op_name(uint16_t op) {
  switch (op) {
    case kOpInvalid: return "INVALID";
    case kOpRequest: return "REQUEST";
    case kOpResponse: return "RESPONSE";
    case kOpRst: return "RST";
    case kOpShutdown: return "SHUTDOWN";
    case kOpRw: return "RW";
    case kOpCreditUpdate: return "CREDIT_UPDATE";
    case kOpCreditRequest: return "CREDIT_REQUEST";
    default: return "?";
  }
}

Verdict check_tx_packet(const Header& h, uint64_t chain_bytes, uint64_t guest_cid) {
  if (chain_bytes < sizeof(Header)) return Verdict::kShort;
  if (h.src_cid != guest_cid) return Verdict::kBadSrcCid;
  if (h.dst_cid != kHostCid) return Verdict::kBadDstCid;
  if (h.type != kTypeStream) return Verdict::kBadType;
  if (h.op == kOpInvalid || h.op > kOpCreditRequest) return Verdict::kBadOp;
  if (h.len > kMaxPayload) return Verdict::kOversized;
  if (h.len > chain_bytes - sizeof(Header)) return Verdict::kTruncated;
  if (h.op != kOpRw && h.len != 0) return Verdict::kStrayPayload;
  return Verdict::kOk;
}

Header host_header(uint64_t guest_cid, uint32_t host_port, uint32_t guest_port, uint16_t op, uint32_t flags,
                   uint32_t len) {
  Header h{};
  h.src_cid = kHostCid;
  h.dst_cid = guest_cid;
  h.src_port = host_port;
  h.dst_port = guest_port;
  h.len = len;
  h.type = kTypeStream;
  h.op = op;
  h.flags = flags;
  return h;
}

}  // namespace torpor::vsock
