// virtio-net (device type 1, virtio 1.2 §5.1): one receive and one transmit
// queue, a MAC address and a link status, no offloads.
//
// The device does no I/O: frames leave through a NetBackend (the user-mode
// network stack's end: StreamBackend speaks QEMU's stream protocol to passt)
// and arrive through receive(). Both directions apply back-pressure instead
// of buffering without bound:
//   guest -> backend: a tx chain is taken only while the backend can_send();
//                     otherwise the chains wait on the available ring and the
//                     backend calls tx_ready() once it has drained.
//   backend -> guest: receive() refuses a frame (false) when the guest posted
//                     no rx buffer or the machine is paused; the backend then
//                     keeps that frame, stops reading its socket, and is told
//                     rx_ready() when buffers arrive.
// So a guest flooding tx grows nothing on the host beyond the backend's
// bounded output buffer, and a host flooding rx waits in the kernel's socket
// buffer.
//
// Every buffer carries the 12-byte virtio_net_hdr_v1 (VERSION_1 always has
// num_buffers). No checksum or segmentation offload is offered, so the header
// the guest sends is ignored and the one we write is all zeros but
// num_buffers = 1. Mergeable rx buffers are not offered (see docs/network.md):
// a frame that does not fit the guest's rx buffer is dropped, which with a
// 1500-byte MTU never happens with Linux's driver.
//
// Snapshot: the MAC and the link state are saved; frames in flight in the
// backend are not (the backend is a host process, restarted on resume: a
// dropped frame is what Ethernet allows, and TCP retransmits).
//
// Threads: every method runs under the transport's lock (VirtioDevice
// contract), except own_backend(), drop_backend() and detach(), which take
// it themselves; the backend calls receive(), end_rx_batch() and tx_ready()
// from its event-loop callback after taking that lock.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "devices/virtio/net/egress_policy.h"
#include "devices/virtio/net/tcp_flows.h"
#include "devices/virtio/queue/queue.h"
#include "devices/virtio/virtio_device.h"
#include "base/guest_memory.h"

namespace torpor {

namespace virtio_net {
inline constexpr uint32_t kDeviceNet = 1;
// Feature bits (virtio 1.2 §5.1.3).
inline constexpr uint64_t kFMtu = uint64_t{1} << 3;
inline constexpr uint64_t kFMac = uint64_t{1} << 5;
inline constexpr uint64_t kFMrgRxbuf = uint64_t{1} << 15;
inline constexpr uint64_t kFStatus = uint64_t{1} << 16;
inline constexpr uint16_t kStatusLinkUp = 1;
// struct virtio_net_hdr_v1.
inline constexpr uint32_t kHeaderLen = 12;
inline constexpr uint32_t kEthHeaderLen = 14;
// Largest frame either way: a 65535-byte IP packet in an Ethernet frame with
// a VLAN tag. passt's own limit is below it.
inline constexpr uint32_t kMaxFrameLen = 65535 + 18;
// Config space: mac[6], status, max_virtqueue_pairs.
inline constexpr uint32_t kConfigLen = 10;
}  // namespace virtio_net

using MacAddress = std::array<uint8_t, 6>;

// "52:54:00:12:34:56" -> bytes. False on anything else (and on a multicast
// address, which no interface may have).
bool parse_mac(const std::string& text, MacAddress* out);
std::string format_mac(const MacAddress& mac);

// The device's view of the network stack behind it. Called with the
// transport's lock held.
class NetBackend {
 public:
  virtual ~NetBackend() = default;
  // Whether one more frame of up to kMaxFrameLen bytes fits now.
  virtual bool can_send() const = 0;
  // One Ethernet frame (no virtio header); only after can_send() said yes.
  virtual void send(const uint8_t* frame, size_t len) = 0;
  // receive() refused a frame earlier and the device can take frames again.
  virtual void rx_ready() = 0;
  // Why the backend died ("" while it lives).
  virtual std::string error() const { return {}; }
};

struct NetStats {
  uint64_t tx_frames = 0, tx_bytes = 0;
  uint64_t rx_frames = 0, rx_bytes = 0;
  uint64_t tx_dropped = 0;   // malformed or too large, or no backend
  uint64_t tx_filtered = 0;  // refused by the egress policy
  uint64_t tx_reset = 0;     // TCP segments of flows the backend does not know, answered with an RST
  uint64_t rx_dropped = 0;   // device not active, malformed, or larger than the rx buffer
  uint64_t tx_stalls = 0;    // times the backend was full
  uint64_t rx_refused = 0;   // times receive() said "not now"
};

class VirtioNetDevice final : public VirtioDevice {
 public:
  static constexpr uint16_t kQueueSize = 256;
  static constexpr uint32_t kRxQueue = 0, kTxQueue = 1;

  VirtioNetDevice(GuestMemory& mem, const MacAddress& mac);

  // VirtioDevice
  const char* name() const override { return "net"; }
  uint32_t device_type() const override { return virtio_net::kDeviceNet; }
  uint64_t device_features() const override;
  uint32_t num_queues() const override { return 2; }
  uint16_t queue_max_size(uint32_t) const override { return kQueueSize; }
  void read_config(uint64_t offset, uint8_t* data, size_t len) override;
  void write_config(uint64_t, const uint8_t*, size_t) override {}
  void attach(VirtioTransport& transport) override { transport_ = &transport; }
  void activate() override;
  void queue_notify(uint32_t index) override;
  void reset() override;
  void save(StateWriter& out) const override;
  void restore(StateReader& in) override;
  void quiesce() override { quiesced_ = true; }
  void unquiesce() override;
  void detach() override { drop_backend(); }

  // --- the backend side (transport lock held)
  // Sets (or, with nullptr, removes) the backend. The link is up while one is
  // set; a change raises a config interrupt so the guest's driver sees it.
  void set_backend(NetBackend* backend);
  // One frame from the network. true: taken (written to the guest, or
  // dropped as Ethernet may); false: not now, keep it and wait for rx_ready().
  bool receive(const uint8_t* frame, size_t len);
  // What the guest may send (per run: the owner sets it with each backend;
  // not part of a snapshot).
  void set_egress_policy(EgressPolicy policy) { policy_ = std::move(policy); }
  // Interrupts the guest once for the frames receive() wrote since the last call.
  void end_rx_batch();
  // The backend has room again after can_send() said no.
  void tx_ready();

  // --- the owner's side (without the transport's lock: a backend's
  // destructor takes it to detach itself)
  // Keeps `backend` (which attached itself with set_backend) for the
  // device's life, or until drop_backend(). Owns at most one: drop the old
  // one before the new one attaches.
  void own_backend(std::unique_ptr<NetBackend> backend);
  // Destroys the backend it owns, which detaches itself (the link goes down).
  void drop_backend();
  // Why the owned backend died ("" while it lives or with none). Lock held.
  std::string backend_error() const { return owned_backend_ ? owned_backend_->error() : std::string(); }

  const MacAddress& mac() const { return mac_; }
  bool link_up() const { return backend_ != nullptr; }
  const NetStats& stats() const { return stats_; }

 private:
  void process_tx();
  void send_chain(const DescriptorChain& chain);
  void refused();
  void deliver_reset();

  GuestMemory& mem_;
  VirtioTransport* transport_ = nullptr;
  NetBackend* backend_ = nullptr;
  std::unique_ptr<NetBackend> owned_backend_;  // set and reset under the lock, destroyed outside it
  MacAddress mac_;
  bool quiesced_ = false;
  bool rx_waiting_ = false;  // receive() refused a frame; rx_ready() owed
  bool tx_stalled_ = false;  // chains wait for tx_ready()
  bool rx_unsignalled_ = false;
  DescriptorChain tx_chain_, rx_chain_;
  EgressPolicy policy_;
  // TCP flows the current backend knows (tcp_flows.h): segments of others get an RST.
  TcpFlowTable flows_;
  std::vector<uint8_t> reset_;  // the RST being delivered
  bool reset_unsignalled_ = false;
  std::vector<uint8_t> scratch_;  // one tx frame with its header
  NetStats stats_;
};

}  // namespace torpor
