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
//
// The one implementation is the transport (mmio/transport.h) over a
// VirtioDevice; each device's folder has its options and its factory
// (blk/make_blk.h, net/make_net.h, rng/make_rng.h, vsock/make_vsock.h).
#pragma once

#include <cstdint>

#include "devices/device.h"

namespace torpor {

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

}  // namespace torpor
