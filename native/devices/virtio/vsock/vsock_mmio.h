// The vsock device as the machine sees it: the virtio-mmio transport around a
// VsockDevice, plus the one thing the bare transport cannot do for it: stop
// the device's socket and timer callbacks (detach) before the transport and
// its queues are destroyed.
#pragma once

#include <memory>

#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/vsock/vsock_device.h"

namespace torpor {

class VsockMmioDevice final : public VirtioMmioDevice {
 public:
  VsockMmioDevice(GuestMemory& mem, IrqLine& irq, EventLoop& loop, uint64_t guest_cid) {
    auto dev = std::make_unique<VsockDevice>(mem, loop, guest_cid);
    vsock_ = dev.get();
    transport_ = std::make_unique<VirtioMmioTransport>(mem, irq, loop, std::move(dev));
  }
  ~VsockMmioDevice() override { vsock_->detach(); }

  const char* name() const override { return transport_->name(); }
  void read(uint64_t offset, uint8_t* data, size_t len) override { transport_->read(offset, data, len); }
  void write(uint64_t offset, const uint8_t* data, size_t len) override { transport_->write(offset, data, len); }
  void save(StateWriter& out) const override { transport_->save(out); }
  void restore(StateReader& in) override { transport_->restore(in); }
  uint32_t num_queues() const override { return transport_->num_queues(); }
  void notify(uint32_t queue) override { transport_->notify(queue); }
  void quiesce() override { transport_->quiesce(); }
  void unquiesce() override { transport_->unquiesce(); }

  VsockDevice& vsock() { return *vsock_; }
  VirtioMmioTransport& transport() { return *transport_; }

 private:
  VsockDevice* vsock_;
  std::unique_ptr<VirtioMmioTransport> transport_;
};

}  // namespace torpor
