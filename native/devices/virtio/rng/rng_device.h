// virtio-rng (virtio 1.2 §5.4): fills the driver's device-writable buffers
// with bytes from the host's getrandom().
#pragma once

#include "devices/virtio/queue/queue.h"
#include "devices/virtio/virtio_device.h"
#include "base/guest_memory.h"

namespace torpor {

class VirtioRngDevice final : public VirtioDevice {
 public:
  // Most bytes served per request: a driver asking for more gets this much
  // (the used length says so) and asks again.
  static constexpr uint32_t kMaxPerRequest = 64 * 1024;

  explicit VirtioRngDevice(GuestMemory& mem) : mem_(mem) {}

  const char* name() const override { return "rng"; }
  uint32_t device_type() const override { return virtio::kDeviceEntropy; }
  uint64_t device_features() const override { return virtio::kFRingFeatures; }
  uint32_t num_queues() const override { return 1; }
  uint16_t queue_max_size(uint32_t) const override { return 64; }
  void read_config(uint64_t, uint8_t* data, size_t len) override;
  void write_config(uint64_t, const uint8_t*, size_t) override {}
  void attach(VirtioTransport& transport) override { transport_ = &transport; }
  void activate() override {}
  void queue_notify(uint32_t index) override;
  void reset() override {}
  void save(StateWriter& out) const override { out.header("virtio-rng", 1); }
  void restore(StateReader& in) override { in.expect_header("virtio-rng", 1, 1); }

 private:
  uint32_t fill(const DescriptorChain& chain);

  GuestMemory& mem_;
  VirtioTransport* transport_ = nullptr;
  DescriptorChain chain_;
};

}  // namespace torpor
