// Test helpers that play the guest's virtio-mmio driver: register access in
// 32-bit words, the standard initialisation sequence (virtio 1.2 §3.1.1),
// and an IrqLine that counts interrupts. Header-only; tests and fuzz only.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "devices/device.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/queue/mock.h"

namespace torpor::testing {

class CountingIrq final : public IrqLine {
 public:
  void set_level(bool high) override { level = high; }
  void trigger() override { count++; }
  std::atomic<int> count{0};
  bool level = false;
};

inline uint32_t reg_read(BusDevice& dev, uint64_t offset) {
  uint32_t v = 0;
  dev.read(offset, reinterpret_cast<uint8_t*>(&v), 4);
  return v;
}
inline void reg_write(BusDevice& dev, uint64_t offset, uint32_t v) {
  dev.write(offset, reinterpret_cast<const uint8_t*>(&v), 4);
}

inline uint64_t read_device_features(BusDevice& dev) {
  reg_write(dev, virtio_mmio::kDeviceFeaturesSel, 0);
  uint64_t lo = reg_read(dev, virtio_mmio::kDeviceFeatures);
  reg_write(dev, virtio_mmio::kDeviceFeaturesSel, 1);
  uint64_t hi = reg_read(dev, virtio_mmio::kDeviceFeatures);
  return lo | (hi << 32);
}

inline void write_driver_features(BusDevice& dev, uint64_t features) {
  reg_write(dev, virtio_mmio::kDriverFeaturesSel, 0);
  reg_write(dev, virtio_mmio::kDriverFeatures, static_cast<uint32_t>(features));
  reg_write(dev, virtio_mmio::kDriverFeaturesSel, 1);
  reg_write(dev, virtio_mmio::kDriverFeatures, static_cast<uint32_t>(features >> 32));
}

inline void setup_queue(BusDevice& dev, uint32_t index, const MockDriverQueue& q) {
  using namespace virtio_mmio;
  reg_write(dev, kQueueSel, index);
  reg_write(dev, kQueueNum, q.size());
  reg_write(dev, kQueueDescLow, static_cast<uint32_t>(q.desc_table()));
  reg_write(dev, kQueueDescHigh, static_cast<uint32_t>(q.desc_table() >> 32));
  reg_write(dev, kQueueDriverLow, static_cast<uint32_t>(q.avail_ring()));
  reg_write(dev, kQueueDriverHigh, static_cast<uint32_t>(q.avail_ring() >> 32));
  reg_write(dev, kQueueDeviceLow, static_cast<uint32_t>(q.used_ring()));
  reg_write(dev, kQueueDeviceHigh, static_cast<uint32_t>(q.used_ring() >> 32));
  reg_write(dev, kQueueReady, 1);
}

// The whole bring-up: reset, ACKNOWLEDGE, DRIVER, features (the device's
// offer masked by `wanted`), FEATURES_OK, the queues, DRIVER_OK. Returns the
// final Status register.
inline uint32_t init_device(BusDevice& dev, const std::vector<const MockDriverQueue*>& queues,
                            uint64_t wanted = ~uint64_t{0}) {
  using namespace virtio_mmio;
  reg_write(dev, kStatus, 0);
  reg_write(dev, kStatus, virtio::kStatusAcknowledge);
  reg_write(dev, kStatus, virtio::kStatusAcknowledge | virtio::kStatusDriver);
  write_driver_features(dev, read_device_features(dev) & wanted);
  uint32_t s = virtio::kStatusAcknowledge | virtio::kStatusDriver | virtio::kStatusFeaturesOk;
  reg_write(dev, kStatus, s);
  if (!(reg_read(dev, kStatus) & virtio::kStatusFeaturesOk)) return reg_read(dev, kStatus);
  for (uint32_t i = 0; i < queues.size(); i++)
    if (queues[i]) setup_queue(dev, i, *queues[i]);
  reg_write(dev, kStatus, s | virtio::kStatusDriverOk);
  return reg_read(dev, kStatus);
}

}  // namespace torpor::testing
