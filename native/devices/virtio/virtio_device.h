// The device side of a virtio device: what the virtio-mmio transport
// (devices/virtio/mmio/) drives, and what the transport offers the device back.
//
// The transport owns the register protocol (feature negotiation, status,
// queue setup, interrupt status, config generation) and the virtqueues; a
// VirtioDevice owns only its device type, its feature bits, its config space
// and what it does with buffers. Splitting it this way lets blk, net, rng and
// vsock share one carefully tested register state machine: every device is
//   std::make_unique<VirtioMmioTransport>(mem, irq, loop, std::make_unique<XDevice>(...))
// and nothing else stands between the machine and it.
//
// Locking: the transport has one mutex per device. Every VirtioDevice method is
// called with it held, whichever thread the call comes from (vCPU threads for
// config access and status changes, the I/O thread for queue notifications).
// Device work that starts elsewhere (an event-loop callback: a vsock socket
// became readable) takes VirtioTransport::lock() first and then checks
// VirtioTransport::active(), because the driver may have reset the device in
// the meantime.
//
// Lifecycle of a device, as the transport calls it:
//   attach(transport)        once, when the transport is built
//   activate()               the driver wrote DRIVER_OK (queues are set up)
//   queue_notify(i)          the driver kicked queue i (on the I/O thread)
//   reset()                  the driver wrote 0 to Status, or the transport is
//                            about to restore a snapshot
//   save()/restore()         device-specific state only; the transport saves
//                            its registers and the queues itself. After
//                            restore() the transport calls activate() again if
//                            the saved status had DRIVER_OK.
//   detach()                 once, first thing in the transport's destructor
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "base/state_io.h"

namespace torpor {

class Virtqueue;

namespace virtio {
// Device types (virtio 1.2 §5).
inline constexpr uint32_t kDeviceBlock = 2;
inline constexpr uint32_t kDeviceEntropy = 4;
inline constexpr uint32_t kDeviceVsock = 19;

// Feature bits shared by every device type.
inline constexpr uint64_t kFRingIndirectDesc = uint64_t{1} << 28;
inline constexpr uint64_t kFRingEventIdx = uint64_t{1} << 29;
inline constexpr uint64_t kFVersion1 = uint64_t{1} << 32;
// The ring features every device of ours supports; devices OR this into
// device_features(). The transport always adds kFVersion1 (modern only).
inline constexpr uint64_t kFRingFeatures = kFRingIndirectDesc | kFRingEventIdx;

// Device status bits (virtio 1.2 §2.1).
inline constexpr uint32_t kStatusAcknowledge = 1;
inline constexpr uint32_t kStatusDriver = 2;
inline constexpr uint32_t kStatusDriverOk = 4;
inline constexpr uint32_t kStatusFeaturesOk = 8;
inline constexpr uint32_t kStatusNeedsReset = 64;
inline constexpr uint32_t kStatusFailed = 128;

// InterruptStatus bits.
inline constexpr uint32_t kInterruptUsedBuffer = 1;
inline constexpr uint32_t kInterruptConfigChange = 2;
}  // namespace virtio

// What the transport offers its device. Valid from attach() for the device's
// whole life.
class VirtioTransport {
 public:
  virtual ~VirtioTransport() = default;

  // The lock every VirtioDevice method is called under (see top of file).
  virtual std::mutex& lock() = 0;
  // True between activate() and reset(), and false once the device failed.
  // Call with lock() held.
  virtual bool active() const = 0;
  // The features the driver accepted (valid once active()).
  virtual uint64_t driver_features() const = 0;
  // Queue i (i < num_queues()). The object lives as long as the transport;
  // its configuration is valid while active().
  virtual Virtqueue& queue(uint32_t index) = 0;

  // The device added buffers to the used ring of `queue`: the transport sets
  // InterruptStatus bit 0 and triggers the IrqLine unless the driver
  // suppressed the interrupt (EVENT_IDX used_event, or VRING_AVAIL_F_NO_INTERRUPT
  // without EVENT_IDX). Call with lock() held, after add_used().
  virtual void signal_used(uint32_t queue) = 0;
  // The config space changed: bumps ConfigGeneration, sets InterruptStatus
  // bit 1 and triggers the IrqLine. Call with lock() held.
  virtual void signal_config_change() = 0;
  // The driver broke the protocol beyond recovery (a malformed descriptor
  // chain, a ring outside RAM): sets DEVICE_NEEDS_RESET, raises a config
  // interrupt and stops delivering notifications until the driver resets the
  // device. `why` is kept for diagnostics (last_error()). Call with lock() held.
  virtual void fail(const char* why) = 0;
};

class VirtioDevice {
 public:
  virtual ~VirtioDevice() = default;

  virtual const char* name() const = 0;
  virtual uint32_t device_type() const = 0;
  // Device-specific bits plus the virtio::kFRing* bits it supports; the
  // transport adds VERSION_1.
  virtual uint64_t device_features() const = 0;
  virtual uint32_t num_queues() const = 0;
  // QueueNumMax for queue i: a power of two, at most 32768.
  virtual uint16_t queue_max_size(uint32_t index) const = 0;

  // Config space access; offset is relative to the config space (MMIO 0x100).
  // Reads outside the device's config space must return zeros; writes
  // outside it are ignored.
  virtual void read_config(uint64_t offset, uint8_t* data, size_t len) = 0;
  virtual void write_config(uint64_t offset, const uint8_t* data, size_t len) = 0;

  virtual void attach(VirtioTransport& transport) = 0;
  // The driver set DRIVER_OK; the queues that are ready() are validated.
  virtual void activate() = 0;
  // Queue `index` has new available buffers (or may have: spurious
  // notifications are allowed). Runs on the I/O thread.
  virtual void queue_notify(uint32_t index) = 0;
  // Back to the state after attach(): drop everything tied to the driver's
  // queues (in-flight requests are already complete: request processing is
  // synchronous under the lock).
  virtual void reset() = 0;

  virtual void save(StateWriter& out) const = 0;
  // Throws Error(SNAPSHOT_INVALID) on a malformed blob.
  virtual void restore(StateReader& in) = 0;
  // After restore(): true when the config space is not the one the saved
  // state describes (virtio-blk over a disk grown since the capture). The
  // transport then tells a live driver as it would at run time: a config
  // change (ConfigGeneration bumped, InterruptStatus bit 1, the IRQ raised).
  virtual bool restored_config_changed() const { return false; }
  // The machine pauses (VirtioMmioDevice::quiesce): from quiesce() until
  // unquiesce() the device must not touch guest memory or raise interrupts
  // from work of its own (socket and timer callbacks). Queue notifications
  // are held back by the transport meanwhile. A device whose work all comes
  // from queue notifications (blk, rng: served synchronously under the lock)
  // has nothing to do here. Called with lock() held.
  virtual void quiesce() {}
  virtual void unquiesce() {}
  // The transport is being destroyed (the vCPUs are stopped): a device with
  // work of its own (socket and timer callbacks, a network backend) stops it
  // here, while the transport, its lock and its queues still exist. Called
  // without the lock (what it stops may be waiting for it). Idempotent.
  virtual void detach() {}
};

}  // namespace torpor
