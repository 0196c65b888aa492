// The virtio-mmio transport, modern layout (version 2, virtio 1.2 §4.2.2).
//
// Owns the register state machine and the virtqueues; the device-specific
// part is a VirtioDevice (devices/virtio/virtio_device.h). Every virtio
// device of ours is exposed as
//   std::make_unique<VirtioMmioTransport>(mem, irq, loop, std::make_unique<XDevice>(...))
//
// Threads: read()/write() come from vCPU threads, notify() from the I/O
// thread. One mutex serialises them and every call into the device, except
// InterruptStatus, InterruptAck and QueueNotify, which take no lock: the
// hot registers never wait behind a request being served (an fdatasync). A
// QueueNotify write that reaches write() (no ioeventfd registered) is not
// served on the vCPU thread: it is posted to the I/O thread, so requests are
// always processed there and a vCPU never waits on disk I/O.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/event_loop.h"
#include "base/guest_memory.h"
#include "devices/virtio/queue/queue.h"
#include "devices/virtio/virtio_device.h"
#include "devices/virtio/virtio_mmio.h"

namespace torpor {

namespace virtio_mmio {
// Register offsets (virtio 1.2 §4.2.2).
inline constexpr uint64_t kMagicValue = 0x000;
inline constexpr uint64_t kVersion = 0x004;
inline constexpr uint64_t kDeviceId = 0x008;
inline constexpr uint64_t kVendorId = 0x00c;
inline constexpr uint64_t kDeviceFeatures = 0x010;
inline constexpr uint64_t kDeviceFeaturesSel = 0x014;
inline constexpr uint64_t kDriverFeatures = 0x020;
inline constexpr uint64_t kDriverFeaturesSel = 0x024;
inline constexpr uint64_t kQueueSel = 0x030;
inline constexpr uint64_t kQueueNumMax = 0x034;
inline constexpr uint64_t kQueueNum = 0x038;
inline constexpr uint64_t kQueueReady = 0x044;
inline constexpr uint64_t kQueueNotify = 0x050;
inline constexpr uint64_t kInterruptStatus = 0x060;
inline constexpr uint64_t kInterruptAck = 0x064;
inline constexpr uint64_t kStatus = 0x070;
inline constexpr uint64_t kQueueDescLow = 0x080;
inline constexpr uint64_t kQueueDescHigh = 0x084;
inline constexpr uint64_t kQueueDriverLow = 0x090;
inline constexpr uint64_t kQueueDriverHigh = 0x094;
inline constexpr uint64_t kQueueDeviceLow = 0x0a0;
inline constexpr uint64_t kQueueDeviceHigh = 0x0a4;
inline constexpr uint64_t kShmSel = 0x0ac;
inline constexpr uint64_t kShmLenLow = 0x0b0;
inline constexpr uint64_t kShmLenHigh = 0x0b4;
inline constexpr uint64_t kShmBaseLow = 0x0b8;
inline constexpr uint64_t kShmBaseHigh = 0x0bc;
inline constexpr uint64_t kQueueReset = 0x0c0;
inline constexpr uint64_t kConfigGeneration = 0x0fc;
inline constexpr uint64_t kConfig = 0x100;

inline constexpr uint32_t kMagic = 0x74726976;   // "virt"
inline constexpr uint32_t kVendor = 0x52505254;  // "TRPR"
}  // namespace virtio_mmio

class VirtioMmioTransport final : public VirtioMmioDevice, public VirtioTransport {
 public:
  VirtioMmioTransport(GuestMemory& mem, IrqLine& irq, EventLoop& loop, std::unique_ptr<VirtioDevice> device);
  ~VirtioMmioTransport() override;

  // BusDevice
  const char* name() const override { return name_.c_str(); }
  void read(uint64_t offset, uint8_t* data, size_t len) override;
  void write(uint64_t offset, const uint8_t* data, size_t len) override;
  void save(StateWriter& out) const override;
  // After a restore, queues that were live are notified once (on the I/O
  // thread), so a kick that was posted but not served before the capture is
  // not lost.
  void restore(StateReader& in) override;

  // VirtioMmioDevice
  uint32_t num_queues() const override;
  void notify(uint32_t queue) override;
  void quiesce() override;
  void unquiesce() override;
  bool quiesced() const;

  // VirtioTransport (for the device)
  std::mutex& lock() override { return mu_; }
  bool active() const override;
  uint64_t driver_features() const override { return driver_features_; }
  Virtqueue& queue(uint32_t index) override { return *queues_[index]; }
  void signal_used(uint32_t queue) override;
  void signal_config_change() override;
  void fail(const char* why) override;

  // Diagnostics and tests.
  uint32_t status() const;
  const std::string& last_error() const { return last_error_; }
  VirtioDevice& device() { return *device_; }
  // The loop notifications are served on (a device's owner attaches its I/O there).
  EventLoop& loop() { return loop_; }

 private:
  uint32_t read_register(uint64_t offset);
  void write_register(uint64_t offset, uint32_t value);
  void write_status(uint32_t value);
  void reset_locked();
  void raise(uint32_t bits);
  void post_notify(uint32_t queue);
  Virtqueue* selected_queue();  // nullptr when QueueSel is out of range

  // Lets posted closures outlive the transport safely: they lock it and
  // find alive == false after destruction.
  // notify_posted[q]: a notification of queue q is queued on the I/O thread.
  // A guest writing QueueNotify in a loop (no ioeventfd) then costs one
  // queued closure per queue, not one per write.
  struct Guard {
    std::mutex mu;
    bool alive = true;
    std::unique_ptr<std::atomic<bool>[]> notify_posted;
  };

  GuestMemory& mem_;
  IrqLine& irq_;
  EventLoop& loop_;
  std::unique_ptr<VirtioDevice> device_;
  std::string name_;
  std::shared_ptr<Guard> guard_;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Virtqueue>> queues_;
  uint32_t status_ = 0;
  uint32_t device_features_sel_ = 0;
  uint32_t driver_features_sel_ = 0;
  uint64_t driver_features_ = 0;
  uint32_t queue_sel_ = 0;
  // Read and acknowledged by vCPUs without the lock, so a guest's interrupt
  // handler never waits behind a block request that holds it.
  std::atomic<uint32_t> interrupt_status_{0};
  uint32_t config_generation_ = 0;
  bool activated_ = false;
  std::string last_error_;
  // Between quiesce() and unquiesce(): notifications are remembered in
  // held_notifies_ (one bit per queue) instead of served.
  bool quiesced_ = false;
  uint64_t held_notifies_ = 0;
};

}  // namespace torpor
