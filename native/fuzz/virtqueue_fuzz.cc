// Fuzz target: the virtqueue and the virtio-blk request parser, with the
// descriptor chains built from the input (structure-aware: raw bytes as a RAM
// image almost never form a chain, so coverage never moved). The device must
// never read or write outside RAM, never loop forever, never crash; a
// malformed queue must end as "broken".
//
// Input:
//   [0] queue size exponent (size = 1 << (b % 9))
//   [1] flags: 1 EVENT_IDX, 2 INDIRECT_DESC offered, 4 read-only disk,
//       8 avail idx taken raw from the next two bytes, 16 notify twice
//   [2] chains (1 + b % 16), then per chain:
//       [segments (1 + b % 8)], per segment 4 bytes:
//         offset u16 (into the 20 KiB data area), length u8 (x 16),
//         kind: 1 device writes, 2 address outside RAM, 4 huge length,
//               8 the rest of the chain goes into an indirect table here,
//               16 a NEXT that points anywhere (loops, out of range),
//               32 INDIRECT flag on a plain descriptor, 64 length = offset
//   the rest: bytes of the data area (block request headers, indirect
//   tables, payloads), repeated to fill it.
// Cheap per input: one static RAM buffer, a device over a loop that never
// starts (no thread, no fd per input), a memory disk kept for the process.
//
//   make -C native/fuzz libfuzzer; native/fuzz/campaign.sh   (clang)
//   make -C native/fuzz run                                   (g++: random inputs)
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "devices/virtio/blk/blk_device.h"
#include "devices/virtio/mmio/test_driver.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/queue/queue.h"
#include "fuzz/reused_machine.h"

using namespace torpor;

namespace {

constexpr uint64_t kRamSize = 32 * 1024;
constexpr uint64_t kRings = 0x1000;  // up to 0x2a10 for 256 entries
constexpr uint64_t kData = 0x3000;  // data area: kData .. kRamSize
constexpr uint64_t kDataSize = kRamSize - kData;
long g_chains = 0, g_broken = 0, g_blk_served = 0;  // reported by the standalone driver

uint8_t g_ram[kRamSize];

struct Layout {
  uint16_t qsize;
  uint64_t desc, avail, used;
};

Layout layout_for(uint16_t qsize) {
  Layout l{qsize, kRings, kRings + 16u * qsize, 0};
  l.used = (l.avail + 6 + 2u * qsize + 3) & ~uint64_t{3};
  return l;
}

void put_desc(uint64_t at, uint64_t addr, uint32_t len, uint16_t flags, uint16_t next) {
  if (at + 16 > kRamSize) return;
  std::memcpy(g_ram + at, &addr, 8);
  std::memcpy(g_ram + at + 8, &len, 4);
  std::memcpy(g_ram + at + 12, &flags, 2);
  std::memcpy(g_ram + at + 14, &next, 2);
}

// Lays out RAM from the input; returns the queue layout (flags in *flags).
Layout build_ram(const uint8_t* data, size_t size, uint8_t* flags) {
  std::memset(g_ram, 0, kData);
  // The indirect tables' area: the input fills the rest of the data area, not this, and the
  // device may have written here (a previous input's buffers, or this input's queue pass):
  // without it an input's behaviour depended on what ran before.
  std::memset(g_ram + kRamSize - 2048, 0, 2048);
  size_t pos = 0;
  auto byte = [&]() -> uint8_t { return pos < size ? data[pos++] : 0; };
  uint16_t qsize = static_cast<uint16_t>(1u << (byte() % 9));
  *flags = byte();
  Layout l = layout_for(qsize);
  int chains = 1 + byte() % 16;
  uint16_t next_desc = 0, published = 0;
  uint64_t table_at = kData + kDataSize - 2048;  // indirect tables: the area's last 2 KiB
  struct Seg {
    uint16_t off;
    uint8_t len, kind;
  };
  std::vector<Seg> segs;
  for (int c = 0; c < chains; c++) {
    int n = 1 + byte() % 8;
    segs.clear();
    for (int i = 0; i < n; i++) {
      Seg s;
      s.off = static_cast<uint16_t>(byte() | (byte() << 8));
      s.len = byte();
      s.kind = byte();
      segs.push_back(s);
    }
    uint16_t head = static_cast<uint16_t>(next_desc % qsize);
    for (int i = 0; i < n; i++) {
      const Seg& s = segs[i];
      uint64_t addr = (s.kind & 2) ? (uint64_t{s.off} << 20) + kRamSize : kData + s.off % kDataSize;
      uint32_t len = (s.kind & 4) ? 0xffffff00u | s.len : (s.kind & 64) ? s.off : 16u * s.len;
      uint16_t dflags = (s.kind & 1) ? virtio::kDescFWrite : 0;
      if (s.kind & 32) dflags |= virtio::kDescFIndirect;
      if ((s.kind & 8) && i + 1 < n) {
        // This descriptor points at an indirect table holding segments i+1..n-1.
        int rest = n - i - 1;
        for (int j = 0; j < rest; j++) {
          const Seg& t = segs[i + 1 + j];
          uint64_t taddr = (t.kind & 2) ? (uint64_t{t.off} << 20) + kRamSize : kData + t.off % kDataSize;
          uint16_t tflags = static_cast<uint16_t>(((t.kind & 1) ? virtio::kDescFWrite : 0) |
                                                  (j + 1 < rest ? virtio::kDescFNext : 0));
          uint16_t tnext = (t.kind & 16) ? t.len : static_cast<uint16_t>(j + 1);
          put_desc(table_at + 16u * j, taddr, 16u * t.len + 1, tflags, tnext);
        }
        uint16_t idx = static_cast<uint16_t>(next_desc++ % qsize);
        put_desc(l.desc + 16u * idx, table_at, static_cast<uint32_t>(16 * rest), virtio::kDescFIndirect, 0);
        table_at = kData + kDataSize - 2048 + (table_at + 16u * rest - (kData + kDataSize - 2048)) % 1024;
        break;
      }
      uint16_t idx = static_cast<uint16_t>(next_desc++ % qsize);
      if (i + 1 < n) dflags |= virtio::kDescFNext;
      uint16_t next = (s.kind & 16) ? static_cast<uint16_t>(s.len) : static_cast<uint16_t>(next_desc % qsize);
      put_desc(l.desc + 16u * idx, addr, len, dflags, next);
    }
    // Publish the head in the available ring.
    uint16_t slot = static_cast<uint16_t>(published % qsize);
    std::memcpy(g_ram + l.avail + 4 + 2u * slot, &head, 2);
    published++;
  }
  uint16_t avail_idx = published;
  if (*flags & 8) avail_idx = static_cast<uint16_t>(byte() | (byte() << 8));
  std::memcpy(g_ram + l.avail + 2, &avail_idx, 2);
  // The rest fills the data area but the indirect tables.
  size_t rest = size - pos;
  uint64_t fill = kDataSize - 2048;
  if (rest == 0) {
    std::memset(g_ram + kData, 0, fill);
  } else {
    // The rest once, then the filled part doubled (a copy per `rest` bytes made a one-byte
    // rest 18,000 copies, ~40% of an input's cost); the same bytes either way.
    uint8_t* area = g_ram + kData;
    uint64_t filled = std::min<uint64_t>(rest, fill);
    std::memcpy(area, data + pos, filled);
    while (filled < fill) {
      uint64_t n = std::min(filled, fill - filled);
      std::memcpy(area + filled, area, n);
      filled += n;
    }
  }
  return l;
}

void fuzz_queue(const Layout& l, uint8_t flags) {
  GuestMemory mem({{0, kRamSize, g_ram}});
  Virtqueue q(256);
  q.set_size(l.qsize);
  q.set_desc_table(l.desc);
  q.set_avail_ring(l.avail);
  q.set_used_ring(l.used);
  q.set_features(flags & 1, flags & 2);
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

// The disk behind virtio-blk: 64 KiB kept for the process (a fresh zeroed MemoryDisk per
// input was ~5% of an input's cost). All zero when a device takes it; what the input's
// requests wrote is zeroed again when the device lets go of it.
class ReusedDisk final : public Disk {
 public:
  static constexpr uint64_t kSize = 64 * 1024;
  ~ReusedDisk() override {
    if (dirty_end_ > dirty_begin_) std::memset(bytes_ + dirty_begin_, 0, dirty_end_ - dirty_begin_);
  }
  uint64_t size() const override { return kSize; }
  bool read_only() const override { return false; }
  int read(uint64_t offset, void* dst, size_t len) override {
    if (!disk_range_ok(kSize, offset, len)) return -EINVAL;
    std::memcpy(dst, bytes_ + offset, len);
    return 0;
  }
  int write(uint64_t offset, const void* src, size_t len) override {
    if (!disk_range_ok(kSize, offset, len)) return -EINVAL;
    std::memcpy(bytes_ + offset, src, len);
    dirty_begin_ = std::min(dirty_begin_, offset);
    dirty_end_ = std::max(dirty_end_, offset + len);
    return 0;
  }
  int flush() override { return 0; }
  static bool all_zero() {
    static const uint8_t zero[kSize] = {};
    return std::memcmp(bytes_, zero, kSize) == 0;
  }

 private:
  static inline uint8_t bytes_[kSize];
  uint64_t dirty_begin_ = kSize, dirty_end_ = 0;
};

void fuzz_blk(const Layout& l, uint8_t flags) {
  GuestMemory mem({{0, kRamSize, g_ram}});
  testing::CountingIrq irq;
  EventLoop& loop = fuzz::idle_loop();  // never started: run_pending() drives it
  {
    VirtioMmioTransport dev(mem, irq, loop,
                            std::make_unique<VirtioBlkDevice>(mem, std::make_unique<ReusedDisk>(), "fuzz", flags & 4));
    using namespace virtio_mmio;
    using testing::reg_write;
    reg_write(dev, kStatus, virtio::kStatusAcknowledge | virtio::kStatusDriver);
    uint64_t features = testing::read_device_features(dev);
    if (!(flags & 1)) features &= ~virtio::kFRingEventIdx;
    if (!(flags & 2)) features &= ~virtio::kFRingIndirectDesc;
    testing::write_driver_features(dev, features);
    reg_write(dev, kStatus, virtio::kStatusAcknowledge | virtio::kStatusDriver | virtio::kStatusFeaturesOk);
    reg_write(dev, kQueueNum, l.qsize);
    reg_write(dev, kQueueDescLow, static_cast<uint32_t>(l.desc));
    reg_write(dev, kQueueDriverLow, static_cast<uint32_t>(l.avail));
    reg_write(dev, kQueueDeviceLow, static_cast<uint32_t>(l.used));
    reg_write(dev, kQueueReady, 1);
    reg_write(dev, kStatus, virtio::kStatusAcknowledge | virtio::kStatusDriver | virtio::kStatusFeaturesOk |
                                virtio::kStatusDriverOk);
    dev.notify(0);
    if (flags & 16) dev.notify(0);
    if (dev.active()) g_blk_served++;
    loop.run_pending();
  }
  loop.run_pending();  // what the teardown posted
#ifdef TORPOR_FUZZ_STANDALONE
  if (!ReusedDisk::all_zero()) std::abort();  // the next input would see this one's writes
#endif
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  uint8_t flags;
  Layout l = build_ram(data, size, &flags);
  fuzz_queue(l, flags);
  l = build_ram(data, size, &flags);  // the queue pass wrote the used ring and buffers
  fuzz_blk(l, flags);
  return 0;
}

#ifdef TORPOR_FUZZ_STANDALONE
// Random inputs in the format above: mostly well-behaved segments (the odd
// kinds now and then), block request headers at the segments' offsets.
int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 20000;
  std::mt19937_64 rng(argc > 2 ? std::atoll(argv[2]) : 1);
  std::vector<uint8_t> input;
  for (long it = 0; it < iterations; it++) {
    input.clear();
    input.push_back(static_cast<uint8_t>(rng() % 9));
    input.push_back(static_cast<uint8_t>(rng() % 32 & ~8));
    int chains = 1 + static_cast<int>(rng() % 16);
    input.push_back(static_cast<uint8_t>(chains - 1));
    for (int c = 0; c < chains; c++) {
      int segs = 1 + static_cast<int>(rng() % 4);
      input.push_back(static_cast<uint8_t>(segs - 1));
      for (int i = 0; i < segs; i++) {
        uint16_t off = static_cast<uint16_t>((rng() % 64) * 256);
        input.push_back(static_cast<uint8_t>(off));
        input.push_back(static_cast<uint8_t>(off >> 8));
        input.push_back(static_cast<uint8_t>(i == 0 ? 1 : 1 + rng() % 64));
        uint8_t kind = i == 0 ? 0 : 1;  // header readable, the rest written by the device
        if (rng() % 12 == 0) kind = static_cast<uint8_t>(rng());
        input.push_back(kind);
      }
    }
    // The data area: a block request header (type, reserved, sector) every 256 bytes.
    for (int h = 0; h < 64; h++) {
      uint32_t type = static_cast<uint32_t>(rng() % 3 ? rng() % 2 : rng() % 16);
      uint64_t sector = rng() % 4 ? rng() % 128 : rng();
      uint8_t hdr[256] = {};
      std::memcpy(hdr, &type, 4);
      std::memcpy(hdr + 8, &sector, 8);
      input.insert(input.end(), hdr, hdr + sizeof hdr);
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("virtqueue_fuzz: %ld random inputs, %ld chains served, %ld queues broken, %ld blk devices still healthy, no crash\n",
              iterations, g_chains, g_broken, g_blk_served);
  return 0;
}
#endif
