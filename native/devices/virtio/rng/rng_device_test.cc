// virtio-rng over the mock driver queue: buffers come back filled with
// host randomness, in full, capped per request.
#include <algorithm>
#include <cstring>

#include "devices/virtio/mmio/test_driver.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/rng/rng_device.h"
#include "test/check.h"

using namespace torpor;
using namespace torpor::testing;

TEST("virtio-rng: fills device-writable buffers with fresh random bytes") {
  FakeRam ram(1 << 20);
  CountingIrq irq;
  EventLoop loop;
  MockDriverQueue driver(ram.mem, 0x10000, 16);
  VirtioMmioTransport dev(ram.mem, irq, loop, std::make_unique<VirtioRngDevice>(ram.mem));
  CHECK(init_device(dev, {&driver}) & virtio::kStatusDriverOk);
  driver.add_chain({{0x40000, 64, true}, {0x41000, 64, true}});
  driver.add_chain({{0x42000, 128, true}});
  dev.notify(0);
  CHECK_EQ(driver.used_idx(), uint16_t{2});
  CHECK_EQ(driver.used(0).len, 128u);
  CHECK_EQ(driver.used(1).len, 128u);
  const uint8_t* a = ram.at(0x40000);
  const uint8_t* b = ram.at(0x42000);
  // 64 zero bytes in a row from getrandom() would be a 2^-512 event.
  CHECK(!std::all_of(a, a + 64, [](uint8_t x) { return x == 0; }));
  CHECK(!std::all_of(ram.at(0x41000), ram.at(0x41000) + 64, [](uint8_t x) { return x == 0; }));
  CHECK(std::memcmp(a, b, 64) != 0);
  CHECK_EQ(irq.count.load(), 1);
}

TEST("virtio-rng: a huge request is served up to the per-request cap") {
  FakeRam ram(1 << 20);
  CountingIrq irq;
  EventLoop loop;
  MockDriverQueue driver(ram.mem, 0x10000, 16);
  VirtioMmioTransport dev(ram.mem, irq, loop, std::make_unique<VirtioRngDevice>(ram.mem));
  CHECK(init_device(dev, {&driver}) & virtio::kStatusDriverOk);
  driver.add_chain({{0x20000, 0x30000, true}, {0x60000, 0x30000, true}});
  dev.notify(0);
  CHECK_EQ(driver.used(0).len, VirtioRngDevice::kMaxPerRequest);
  // Readable-only chains get nothing (and break nothing).
  driver.add_chain({{0x20000, 16, false}});
  dev.notify(0);
  CHECK_EQ(driver.used(1).len, 0u);
  CHECK(!(reg_read(dev, virtio_mmio::kStatus) & virtio::kStatusNeedsReset));
}
