// The contract between the machine (native/vmm) and the virtio devices.
//
// Each virtio device is exposed to the guest through a virtio-mmio (version 2,
// modern) transport occupying a 4 KiB MMIO window. The machine places it on the
// bus, gives it an edge-triggered IrqLine (one GSI per device), and, for each
// queue, may register a KVM ioeventfd on the QueueNotify register (offset
// 0x50, 4 bytes, datamatch = queue index) whose events it forwards to notify()
// from the I/O thread. Without an ioeventfd the guest's QueueNotify write
// arrives through write() on a vCPU thread and has the same effect.
//
// Thread safety: read()/write() arrive on vCPU threads (several at once),
// notify() and event-loop callbacks on the I/O thread; each device serialises
// internally.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "devices/device.h"
#include "base/event_loop.h"
#include "base/guest_memory.h"

namespace torpor {

class Disk;

inline constexpr uint64_t kVirtioMmioWindow = 0x1000;
inline constexpr uint64_t kVirtioMmioQueueNotify = 0x50;

class VirtioMmioDevice : public BusDevice {
 public:
  virtual uint32_t num_queues() const = 0;
  virtual void notify(uint32_t queue) = 0;
  // Pause support, called on the I/O thread once every vCPU is out of
  // KVM_RUN: after quiesce() the device touches no guest memory, raises no
  // interrupt and does no work on its own (socket and timer callbacks only
  // note what happened; notifications are remembered). unquiesce() re-arms
  // and serves what was remembered. Both idempotent.
  virtual void quiesce() = 0;
  virtual void unquiesce() = 0;
};

struct BlkOptions {
  std::string base_path;     // read-only base image (may be empty: overlay only)
  std::string overlay_path;  // copy-on-write overlay data file (created if missing)
  uint64_t size_bytes = 0;   // 0: size of the base image
  bool read_only = false;    // refuse guest writes (VIRTIO_BLK_F_RO)
  std::string serial;        // VIRTIO_BLK_T_GET_ID answer (<= 20 bytes)
  // Overlays frozen by earlier snapshot generations, oldest first, between
  // the base and overlay_path (read-only). The machine opens such a chain
  // itself (snapshot/disk_layers.h) and hands the disk to make_virtio_blk_on.
  std::vector<std::string> frozen_overlays;
};

struct VsockOptions {
  uint64_t guest_cid = 3;
};

struct NetOptions {
  std::string mac;             // "52:54:00:xx:xx:xx"
  std::string backend_socket;  // passt's Unix socket; empty: no backend yet (link down)
};

// Counters of the vsock device (VsockHost::stats).
struct VsockStats {
  uint64_t tx_packets = 0;     // packets taken from the tx queue
  uint64_t rx_packets = 0;     // packets written to the rx queue
  uint64_t dropped = 0;        // malformed packets dropped
  uint64_t rst_sent = 0;
  uint64_t connections = 0;    // connections established
  uint64_t live = 0;           // connections now in the table
  uint64_t events = 0;         // transport reset events delivered
  uint64_t knocks = 0;         // guest REQUESTs to a knock port (VsockHost::set_knock_ports)
  // Host REQUESTs that waited after a transport reset until the guest re-posted its event buffer.
  uint64_t held_requests = 0;
  std::string last_drop;       // why the last packet was dropped
};

// Host side of the vsock device: host-initiated stream connections.
class VsockHost {
 public:
  virtual ~VsockHost() = default;
  // Opens a connection to the guest's port. `done` runs on the I/O thread
  // once the guest answered: with the host end of a socketpair (the caller
  // owns it) or with fd = -1 and an error code/message (VSOCK_REFUSED on RST,
  // TIMEOUT when the guest never answered within timeout_ms).
  virtual void connect(uint32_t port, uint32_t timeout_ms,
                       std::function<void(int fd, const char* code, const std::string& message)> done) = 0;
  // Sends a transport-reset event to the guest and drops every connection
  // (used after restore).
  virtual void transport_reset() = 0;
  // Host ports (1..1023, below every ephemeral port of ours) on which a
  // guest-initiated REQUEST is a knock: the guest saying "I listen now"
  // (docs/protocol.md, the agent's knock). A knock is counted per port,
  // answered RST, and reported through `knocked`, called on the I/O thread
  // with no lock held, with at most one report outstanding: a guest knocking
  // in a loop costs a counter, never memory. Call before the machine starts;
  // replaces any earlier set (and keeps no counts).
  virtual void set_knock_ports(const std::vector<uint32_t>& ports, std::function<void()> knocked) = 0;
  // Knocks counted on each knock port since set_knock_ports (latched: a
  // waiter that looks late still sees them), in port order.
  virtual std::vector<std::pair<uint32_t, uint64_t>> knocks() const = 0;
  // The device's counters (takes the transport's lock).
  virtual VsockStats stats() const = 0;
};

std::unique_ptr<VirtioMmioDevice> make_virtio_blk(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                  const BlkOptions& opts);
// The same over a disk already opened (a snapshot's chain of layers).
std::unique_ptr<VirtioMmioDevice> make_virtio_blk_on(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                     std::unique_ptr<Disk> disk, const BlkOptions& opts);
std::unique_ptr<VirtioMmioDevice> make_virtio_rng(GuestMemory& mem, IrqLine& irq, EventLoop& loop);
// The returned VsockHost lives as long as the device.
std::unique_ptr<VirtioMmioDevice> make_virtio_vsock(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                    const VsockOptions& opts, VsockHost** host);
// virtio-net (devices/virtio/net/): throws INVALID_ARGUMENT on a bad MAC,
// NET_BACKEND when the backend socket cannot be connected.
std::unique_ptr<VirtioMmioDevice> make_virtio_net(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                  const NetOptions& opts);

}  // namespace torpor
