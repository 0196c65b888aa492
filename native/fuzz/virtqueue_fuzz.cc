// Fuzz target: the virtqueue and the virtio-blk request parser over guest
// memory the fuzzer controls entirely (rings, descriptors, indirect tables,
// request headers). The device must never read or write outside RAM, never
// loop forever, never crash; a malformed queue must end as "broken".
//
// libFuzzer (clang):
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Inative
//     native/fuzz/virtqueue_fuzz.cc native/devices/virtio/queue/queue.cc
//     native/devices/virtio/blk/blk_device.cc native/devices/virtio/mmio/transport.cc
//     native/base/guest_memory.cc native/base/event_loop.cc native/common/error.cc -o virtqueue_fuzz
// Without clang (g++ only), a random-input driver is built in:
//   g++ -std=c++20 -O1 -fsanitize=address,undefined -DTORPOR_FUZZ_STANDALONE -Inative <same sources> -pthread
//   ./virtqueue_fuzz [iterations]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "devices/virtio/blk/blk_device.h"
#include "devices/virtio/blk/memory_disk.h"
#include "devices/virtio/mmio/test_driver.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/queue/queue.h"

using namespace torpor;

namespace {

constexpr uint64_t kRamSize = 64 * 1024;
constexpr uint64_t kRings = 0x1000;  // where the rings sit in the fuzzed RAM
long g_chains = 0, g_broken = 0, g_blk_served = 0;  // reported by the standalone driver

void fuzz_queue(const uint8_t* data, size_t size) {
  if (size < 2) return;
  uint16_t qsize = static_cast<uint16_t>(1u << (data[0] % 9));  // 1..256
  bool event_idx = data[1] & 1, indirect = data[1] & 2;
  std::vector<uint8_t> ram(kRamSize);
  std::memcpy(ram.data(), data + 2, std::min<size_t>(size - 2, ram.size()));
  GuestMemory mem({{0, ram.size(), ram.data()}});
  Virtqueue q(256);
  q.set_size(qsize);
  q.set_desc_table(kRings);
  q.set_avail_ring(kRings + 16u * qsize);
  q.set_used_ring((kRings + 16u * qsize + 6 + 2u * qsize + 3) & ~uint64_t{3});
  q.set_features(event_idx, indirect);
  q.set_ready(true);
  if (q.validate(mem)) return;
  DescriptorChain chain;
  uint8_t scratch[64];
  for (int i = 0; i < 512; i++) {
    PopStatus st = q.pop(mem, chain);
    if (st == PopStatus::kBroken) g_broken++;
    if (st != PopStatus::kChain) break;
    g_chains++;
    for (const auto& b : chain.readable())
      if (!mem.contains(b.gpa, b.len)) std::abort();
    for (const auto& b : chain.writable())
      if (!mem.contains(b.gpa, b.len)) std::abort();
    chain.read(mem, 0, scratch, std::min<uint64_t>(sizeof scratch, chain.readable_bytes()));
    chain.write(mem, 0, scratch, std::min<uint64_t>(sizeof scratch, chain.writable_bytes()));
    q.add_used(mem, chain.head(), static_cast<uint32_t>(chain.writable_bytes()));
    q.needs_interrupt(mem);
  }
}

// Same input layout as fuzz_queue: [queue size exponent][flags][RAM...].
void fuzz_blk(const uint8_t* data, size_t size) {
  if (size < 2) return;
  std::vector<uint8_t> ram(kRamSize);
  std::memcpy(ram.data(), data + 2, std::min<size_t>(size - 2, ram.size()));
  GuestMemory mem({{0, ram.size(), ram.data()}});
  testing::CountingIrq irq;
  EventLoop loop;
  VirtioMmioTransport dev(mem, irq, loop,
                          std::make_unique<VirtioBlkDevice>(mem, std::make_unique<MemoryDisk>(64 * 1024), "fuzz", data[1] & 4));
  // Bring the device up by hand over the fuzzed rings (the mock would overwrite them).
  using namespace virtio_mmio;
  using testing::reg_write;
  reg_write(dev, kStatus, virtio::kStatusAcknowledge | virtio::kStatusDriver);
  uint64_t features = testing::read_device_features(dev);
  if (!(data[1] & 1)) features &= ~virtio::kFRingEventIdx;
  if (!(data[1] & 2)) features &= ~virtio::kFRingIndirectDesc;
  testing::write_driver_features(dev, features);
  reg_write(dev, kStatus, virtio::kStatusAcknowledge | virtio::kStatusDriver | virtio::kStatusFeaturesOk);
  uint16_t qsize = static_cast<uint16_t>(1u << (data[0] % 9));
  reg_write(dev, kQueueNum, qsize);
  reg_write(dev, kQueueDescLow, kRings);
  reg_write(dev, kQueueDriverLow, static_cast<uint32_t>(kRings + 16u * qsize));
  reg_write(dev, kQueueDeviceLow, static_cast<uint32_t>((kRings + 16u * qsize + 6 + 2u * qsize + 3) & ~3u));
  reg_write(dev, kQueueReady, 1);
  reg_write(dev, kStatus, virtio::kStatusAcknowledge | virtio::kStatusDriver | virtio::kStatusFeaturesOk |
                              virtio::kStatusDriverOk);
  dev.notify(0);
  dev.notify(0);
  if (dev.active()) g_blk_served++;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_queue(data, size);
  fuzz_blk(data, size);
  return 0;
}

#ifdef TORPOR_FUZZ_STANDALONE
// Random inputs shaped to hit the interesting paths: mostly-small descriptor
// indices and lengths, addresses inside the 64 KiB RAM, NEXT/WRITE/INDIRECT flags.
int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 20000;
  std::mt19937_64 rng(argc > 2 ? std::atoll(argv[2]) : 1);
  std::vector<uint8_t> input(2 + kRamSize);
  for (long it = 0; it < iterations; it++) {
    for (auto& b : input) b = static_cast<uint8_t>(rng());
    uint8_t* ram = input.data() + 2;
    uint16_t qsize = static_cast<uint16_t>(1u << (input[0] % 9));
    // Mostly well-formed chains (readable then writable, next = i + 1, in-RAM
    // buffers), each field broken now and then.
    auto bad = [&] { return rng() % 40 == 0; };
    for (uint32_t i = 0; i < qsize; i++) {
      uint64_t addr = bad() ? rng() : 0x8000 + rng() % 0x7000;
      uint32_t len = bad() ? static_cast<uint32_t>(rng()) : static_cast<uint32_t>(1 + rng() % 2048);
      uint16_t flags = static_cast<uint16_t>((rng() % 3 ? 1 : 0) | (i % 4 >= 2 ? 2 : 0) | (bad() ? 4 : 0));
      uint16_t next = static_cast<uint16_t>(bad() ? rng() % 300 : (i + 1) % qsize);
      uint8_t* d = ram + kRings + 16 * i;
      std::memcpy(d, &addr, 8);
      std::memcpy(d + 8, &len, 4);
      std::memcpy(d + 12, &flags, 2);
      std::memcpy(d + 14, &next, 2);
    }
    uint8_t* avail = ram + kRings + 16 * qsize;
    uint16_t zero = 0, idx = static_cast<uint16_t>(bad() ? rng() : 1 + rng() % qsize);
    std::memcpy(avail, &zero, 2);
    std::memcpy(avail + 2, &idx, 2);
    for (uint32_t i = 0; i < qsize; i++) {
      uint16_t head = static_cast<uint16_t>(bad() ? rng() : rng() % qsize);
      std::memcpy(avail + 4 + 2 * i, &head, 2);
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("virtqueue_fuzz: %ld random inputs, %ld chains served, %ld queues broken, %ld blk devices still healthy, no crash\n",
              iterations, g_chains, g_broken, g_blk_served);
  return 0;
}
#endif
