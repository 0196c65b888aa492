// virtio-blk requests end to end: a mock driver queue in fake guest memory,
// the virtio-mmio transport, the blk device, an in-memory disk (request
// parsing) or the real base + overlay files (make_virtio_blk).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "devices/virtio/blk/blk_device.h"
#include "devices/virtio/blk/make_blk.h"
#include "devices/virtio/blk/memory_disk.h"
#include "devices/virtio/mmio/test_driver.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/rng/make_rng.h"
#include "test/check.h"

using namespace torpor;
using namespace torpor::testing;
using namespace torpor::virtio_blk;
using torpor::virtio_mmio::kConfig;

namespace {

constexpr uint64_t kRings = 0x10000;
constexpr uint64_t kHdr = 0x30000;
constexpr uint64_t kData = 0x40000;
constexpr uint64_t kStatus = 0x3f000;

struct BlkRig {
  FakeRam ram{1 << 20};
  CountingIrq irq;
  EventLoop loop;
  MockDriverQueue driver{ram.mem, kRings, 64};
  MemoryDisk* disk = nullptr;
  std::unique_ptr<VirtioMmioDevice> dev;

  explicit BlkRig(uint64_t disk_bytes = 64 * 1024, bool read_only = false) {
    auto d = std::make_unique<MemoryDisk>(disk_bytes);
    disk = d.get();
    for (size_t i = 0; i < disk->bytes().size(); i++) disk->bytes()[i] = static_cast<uint8_t>(i * 13 + 1);
    init(std::make_unique<VirtioMmioTransport>(
        ram.mem, irq, loop, std::make_unique<VirtioBlkDevice>(ram.mem, std::move(d), "torpor-disk-0", read_only)));
  }
  using Factory = std::function<std::unique_ptr<VirtioMmioDevice>(GuestMemory&, IrqLine&, EventLoop&)>;
  explicit BlkRig(const Factory& make) { init(make(ram.mem, irq, loop)); }
  void init(std::unique_ptr<VirtioMmioDevice> d) {
    dev = std::move(d);
    uint32_t s = init_device(*dev, {&driver});
    CHECK(s & virtio::kStatusDriverOk);
  }
  void header(uint32_t type, uint64_t sector) {
    RequestHeader h{type, 0, sector};
    ram.mem.write_obj(kHdr, h);
    ram.mem.write_obj<uint8_t>(kStatus, 0xee);
  }
  // Submits the chain, serves it, returns the status byte.
  uint8_t run(std::initializer_list<MockDriverQueue::Seg> segs) {
    uint16_t before = driver.used_idx();
    driver.add_chain(segs);
    dev->notify(0);
    CHECK_EQ(driver.used_idx(), static_cast<uint16_t>(before + 1));
    return *ram.mem.read_obj<uint8_t>(kStatus);
  }
  uint32_t last_used_len() { return driver.used(static_cast<uint16_t>(driver.used_idx() - 1)).len; }
  uint8_t* at(uint64_t gpa) { return ram.at(gpa); }
};

}  // namespace

TEST("virtio-blk: config space and features") {
  BlkRig r(1 << 20);
  uint64_t cap = 0;
  r.dev->read(kConfig, reinterpret_cast<uint8_t*>(&cap), 8);
  CHECK_EQ(cap, uint64_t{2048});
  uint32_t blk = 0, seg = 0;
  r.dev->read(kConfig + 20, reinterpret_cast<uint8_t*>(&blk), 4);
  r.dev->read(kConfig + 12, reinterpret_cast<uint8_t*>(&seg), 4);
  CHECK_EQ(blk, 512u);
  CHECK_EQ(seg, kSegMax);
  uint32_t past = 0xffffffff;
  r.dev->read(kConfig + 0x200, reinterpret_cast<uint8_t*>(&past), 4);
  CHECK_EQ(past, 0u);
  uint64_t f = read_device_features(*r.dev);
  CHECK(f & kFFlush);
  CHECK(f & kFSegMax);
  CHECK(f & kFBlkSize);
  CHECK(!(f & kFRo));
  BlkRig ro(4096, true);
  CHECK(read_device_features(*ro.dev) & kFRo);
}

TEST("virtio-blk: IN reads sectors into several guest buffers") {
  BlkRig r;
  r.header(kTIn, 3);
  uint8_t st = r.run({{kHdr, 16, false}, {kData, 512, true}, {kData + 0x1000, 1024, true}, {kStatus, 1, true}});
  CHECK_EQ(st, kSOk);
  CHECK(std::memcmp(r.at(kData), r.disk->bytes().data() + 3 * 512, 512) == 0);
  CHECK(std::memcmp(r.at(kData + 0x1000), r.disk->bytes().data() + 4 * 512, 1024) == 0);
  CHECK_EQ(r.last_used_len(), 1537u);
  CHECK_EQ(r.irq.count.load(), 1);
}

TEST("virtio-blk: OUT writes sectors, header and data may share a buffer, status in the data buffer") {
  BlkRig r;
  // Header and 512 bytes of data in one descriptor.
  r.header(kTOut, 10);
  std::memset(r.at(kHdr + 16), 0x5a, 512);
  CHECK_EQ(r.run({{kHdr, 16 + 512, false}, {kStatus, 1, true}}), kSOk);
  CHECK(std::all_of(r.disk->bytes().begin() + 10 * 512, r.disk->bytes().begin() + 11 * 512,
                    [](uint8_t b) { return b == 0x5a; }));
  CHECK_EQ(r.last_used_len(), 1u);
  // IN with the status byte at the end of the data buffer itself.
  r.header(kTIn, 10);
  r.driver.add_chain({{kHdr, 16, false}, {kData, 513, true}});
  r.dev->notify(0);
  CHECK_EQ(r.at(kData)[0], uint8_t{0x5a});
  CHECK_EQ(r.at(kData)[512], kSOk);
}

TEST("virtio-blk: sector ranges are bounds-checked (IOERR), never clamped") {
  BlkRig r(64 * 1024);  // 128 sectors
  auto before = r.disk->bytes();
  r.header(kTIn, 127);
  CHECK_EQ(r.run({{kHdr, 16, false}, {kData, 1024, true}, {kStatus, 1, true}}), kSIoErr);
  r.header(kTOut, 128);
  CHECK_EQ(r.run({{kHdr, 16, false}, {kData, 512, false}, {kStatus, 1, true}}), kSIoErr);
  r.header(kTOut, ~uint64_t{0} / 512);  // sector * 512 would overflow
  CHECK_EQ(r.run({{kHdr, 16, false}, {kData, 512, false}, {kStatus, 1, true}}), kSIoErr);
  r.header(kTIn, 0);  // not a whole number of sectors
  CHECK_EQ(r.run({{kHdr, 16, false}, {kData, 100, true}, {kStatus, 1, true}}), kSIoErr);
  r.header(kTIn, 127);  // the last sector is fine
  CHECK_EQ(r.run({{kHdr, 16, false}, {kData, 512, true}, {kStatus, 1, true}}), kSOk);
  CHECK(r.disk->bytes() == before);
}

TEST("virtio-blk: read-only refuses OUT; FLUSH, GET_ID and unknown types") {
  BlkRig ro(4096, true);
  ro.header(kTOut, 0);
  CHECK_EQ(ro.run({{kHdr, 16, false}, {kData, 512, false}, {kStatus, 1, true}}), kSIoErr);
  BlkRig r;
  r.header(kTFlush, 0);
  CHECK_EQ(r.run({{kHdr, 16, false}, {kStatus, 1, true}}), kSOk);
  CHECK_EQ(r.disk->flushes(), 1);
  r.header(kTGetId, 0);
  std::memset(r.at(kData), 0xff, 20);
  CHECK_EQ(r.run({{kHdr, 16, false}, {kData, 20, true}, {kStatus, 1, true}}), kSOk);
  CHECK(std::memcmp(r.at(kData), "torpor-disk-0\0\0\0\0\0\0\0", 20) == 0);
  CHECK_EQ(r.last_used_len(), 21u);
  r.header(11 /* DISCARD: not offered */, 0);
  CHECK_EQ(r.run({{kHdr, 16, false}, {kData, 16, false}, {kStatus, 1, true}}), kSUnsupp);
  r.header(0x7777, 0);
  CHECK_EQ(r.run({{kHdr, 16, false}, {kStatus, 1, true}}), kSUnsupp);
}

TEST("virtio-blk: requests without a status byte or header are returned, not served") {
  BlkRig r;
  auto before = r.disk->bytes();
  r.header(kTOut, 0);
  r.driver.add_chain({{kHdr, 16, false}, {kData, 512, false}});  // nothing writable
  r.dev->notify(0);
  CHECK_EQ(r.driver.used_idx(), uint16_t{1});
  CHECK_EQ(r.last_used_len(), 0u);
  r.driver.add_chain({{kHdr, 8, false}, {kStatus, 1, true}});  // header too short
  r.dev->notify(0);
  CHECK_EQ(r.driver.used_idx(), uint16_t{2});
  CHECK(r.disk->bytes() == before);
}

TEST("virtio-blk: a malformed chain sets DEVICE_NEEDS_RESET instead of crashing") {
  BlkRig r;
  r.header(kTIn, 0);
  r.driver.add_chain({{kHdr, 16, false}, {0xd0000000, 512, true}, {kStatus, 1, true}});
  r.dev->notify(0);
  CHECK(reg_read(*r.dev, virtio_mmio::kStatus) & virtio::kStatusNeedsReset);
  CHECK_EQ(r.driver.used_idx(), uint16_t{0});
}

TEST("virtio-blk: a batch of requests gets one interrupt") {
  BlkRig r;
  for (int i = 0; i < 8; i++) {
    r.header(kTIn, 0);
    r.driver.add_chain({{kHdr, 16, false}, {kData + 512u * i, 512, true}, {kStatus, 1, true}});
  }
  r.dev->notify(0);
  CHECK_EQ(r.driver.used_idx(), uint16_t{8});
  CHECK_EQ(r.irq.count.load(), 1);
}

TEST("virtio-blk: make_virtio_blk over base + overlay files; the base is never written") {
  char tmpl[] = "/tmp/torpor-blk-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  std::string base_path = dir + "/base.img", overlay = dir + "/disk.overlay";
  std::vector<uint8_t> base(256 * 1024);
  for (size_t i = 0; i < base.size(); i++) base[i] = static_cast<uint8_t>(i / 512);
  {
    std::ofstream f(base_path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(base.data()), static_cast<std::streamsize>(base.size()));
  }
  {
    BlkOptions opts;
    opts.base_path = base_path;
    opts.overlay_path = overlay;
    opts.serial = "s1";
    BlkRig r([&](GuestMemory& m, IrqLine& i, EventLoop& l) { return make_virtio_blk(m, i, l, opts); });
    // Write sector 9 (inside block 1: copy-up), flush, read sectors 8-10 back.
    r.header(kTOut, 9);
    std::memset(r.at(kData), 0xab, 512);
    CHECK_EQ(r.run({{kHdr, 16, false}, {kData, 512, false}, {kStatus, 1, true}}), kSOk);
    r.header(kTFlush, 0);
    CHECK_EQ(r.run({{kHdr, 16, false}, {kStatus, 1, true}}), kSOk);
    r.header(kTIn, 8);
    CHECK_EQ(r.run({{kHdr, 16, false}, {kData + 0x2000, 1536, true}, {kStatus, 1, true}}), kSOk);
    CHECK_EQ(r.at(kData + 0x2000)[0], uint8_t{8});
    CHECK_EQ(r.at(kData + 0x2000)[512], uint8_t{0xab});
    CHECK_EQ(r.at(kData + 0x2000)[1024], uint8_t{10});
  }
  {
    std::ifstream f(base_path, std::ios::binary);
    std::vector<uint8_t> now((std::istreambuf_iterator<char>(f)), {});
    CHECK(now == base);
  }
  {
    // Reopen: the flushed write is there.
    FakeRam ram(1 << 20);
    CountingIrq irq;
    EventLoop loop;
    BlkOptions opts;
    opts.base_path = base_path;
    opts.overlay_path = overlay;
    BlkRig r([&](GuestMemory& m, IrqLine& i, EventLoop& l) { return make_virtio_blk(m, i, l, opts); });
    r.header(kTIn, 9);
    CHECK_EQ(r.run({{kHdr, 16, false}, {kData, 512, true}, {kStatus, 1, true}}), kSOk);
    CHECK_EQ(r.at(kData)[100], uint8_t{0xab});
    // Writable without an overlay is refused; a long serial (lib's to check) is asserted.
    BlkOptions bad;
    bad.base_path = base_path;
    CHECK_THROWS_CODE(make_virtio_blk(ram.mem, irq, loop, bad), "INVALID_ARGUMENT");
    bad.read_only = true;
    bad.serial = std::string(21, 'x');
    CHECK_THROWS_CODE(make_virtio_blk(ram.mem, irq, loop, bad), "INTERNAL");
    bad.serial.clear();
    auto ro = make_virtio_blk(ram.mem, irq, loop, bad);  // read-only straight off the base
    CHECK(ro != nullptr);
  }
  std::filesystem::remove_all(dir);
}

TEST("virtio-blk: save/restore round trip; a blob for a larger disk is refused (never shrink)") {
  BlkRig a;
  StateWriter w;
  a.dev->save(w);
  BlkRig b;
  StateReader in(w.data());
  b.dev->restore(in);
  in.expect_end();
  b.header(kTIn, 0);
  b.driver.add_chain({{kHdr, 16, false}, {kData, 512, true}, {kStatus, 1, true}});
  b.dev->notify(0);
  CHECK_EQ(b.driver.used_idx(), uint16_t{1});
  BlkRig c(32 * 1024);
  StateReader in2(w.data());
  CHECK_THROWS_CODE(c.dev->restore(in2), "SNAPSHOT_INVALID");
}

namespace {
uint64_t config_capacity(VirtioMmioDevice& dev) {
  uint64_t cap = 0;
  dev.read(kConfig, reinterpret_cast<uint8_t*>(&cap), 8);
  return cap;
}
}  // namespace

TEST("virtio-blk: restored over a grown disk: new capacity, config change raised, generation bumped") {
  using virtio_mmio::kConfigGeneration;
  using virtio_mmio::kInterruptAck;
  using virtio_mmio::kInterruptStatus;
  BlkRig a(64 * 1024);
  const uint32_t gen = reg_read(*a.dev, kConfigGeneration);
  StateWriter w;
  a.dev->save(w);

  BlkRig b(192 * 1024);  // the same machine, restored with its disk grown
  const int irqs = b.irq.count.load();
  StateReader in(w.data());
  b.dev->restore(in);
  in.expect_end();
  CHECK_EQ(config_capacity(*b.dev), uint64_t{384});
  CHECK_EQ(reg_read(*b.dev, kConfigGeneration), gen + 1);
  CHECK(reg_read(*b.dev, kInterruptStatus) & virtio::kInterruptConfigChange);
  CHECK(b.irq.count.load() > irqs);
  // Sectors past the old end are served (the old bound no longer applies).
  b.header(kTOut, 300);
  std::memset(b.at(kData), 0x5a, 512);
  CHECK_EQ(b.run({{kHdr, 16, false}, {kData, 512, false}, {kStatus, 1, true}}), kSOk);
  CHECK_EQ(b.disk->bytes()[300 * 512], 0x5a);
  b.header(kTIn, 383);
  CHECK_EQ(b.run({{kHdr, 16, false}, {kData, 512, true}, {kStatus, 1, true}}), kSOk);
  b.header(kTIn, 384);
  CHECK_EQ(b.run({{kHdr, 16, false}, {kData, 512, true}, {kStatus, 1, true}}), kSIoErr);

  // The driver acknowledges; a capture now carries the grown capacity and the new generation.
  reg_write(*b.dev, kInterruptAck, virtio::kInterruptConfigChange);
  StateWriter w2;
  b.dev->save(w2);
  BlkRig c(192 * 1024);
  StateReader in2(w2.data());
  c.dev->restore(in2);
  CHECK_EQ(config_capacity(*c.dev), uint64_t{384});
  CHECK_EQ(reg_read(*c.dev, kConfigGeneration), gen + 1);  // no second change
  CHECK(!(reg_read(*c.dev, kInterruptStatus) & virtio::kInterruptConfigChange));
  // ...and cannot be restored over the old, smaller disk.
  BlkRig d(64 * 1024);
  StateReader in3(w2.data());
  CHECK_THROWS_CODE(d.dev->restore(in3), "SNAPSHOT_INVALID");
}

TEST("virtio-blk: bench 4 KiB requests through transport + device (printed, not asserted)") {
  char tmpl[] = "/tmp/torpor-blkbench-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  BlkOptions opts;
  opts.overlay_path = dir + "/bench.overlay";
  opts.size_bytes = 16 << 20;
  BlkRig r([&](GuestMemory& m, IrqLine& i, EventLoop& l) { return make_virtio_blk(m, i, l, opts); });
  auto bench = [&](uint32_t type, bool writes_data, int n) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; i++) {
      r.header(type, static_cast<uint64_t>(i % 4096) * 8);
      r.driver.add_chain({{kHdr, 16, false}, {kData, 4096, !writes_data}, {kStatus, 1, true}});
      r.dev->notify(0);
    }
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n;
  };
  double w = bench(kTOut, true, 4096);
  auto t0 = std::chrono::steady_clock::now();
  r.header(kTFlush, 0);
  r.run({{kHdr, 16, false}, {kStatus, 1, true}});
  double flush_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  double rd = bench(kTIn, false, 4096);
  std::printf("  bench: virtio-blk 4 KiB over the overlay file: write %.1f us/req, read %.1f us/req, flush of 16 MiB %.1f ms "
              "(one request per notify; %s)\n", w, rd, flush_ms, torpor_test::kBuildKind);
  CHECK_EQ(*r.ram.mem.read_obj<uint8_t>(kStatus), kSOk);
  std::filesystem::remove_all(dir);
}

TEST("virtio-blk: DISCARD over the overlay, offered only when the disk takes it; bad segments change nothing") {
  BlkRig mem_disk;  // MemoryDisk: no discard
  CHECK(!(read_device_features(*mem_disk.dev) & kFDiscard));
  char tmpl[] = "/tmp/torpor-blkdiscard-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  BlkOptions opts;
  opts.overlay_path = dir + "/d.overlay";
  opts.size_bytes = 1 << 20;
  BlkRig r([&](GuestMemory& m, IrqLine& i, EventLoop& l) { return make_virtio_blk(m, i, l, opts); });
  CHECK(read_device_features(*r.dev) & kFDiscard);
  uint32_t max_seg = 0;
  r.dev->read(kConfig + 40, reinterpret_cast<uint8_t*>(&max_seg), 4);
  CHECK_EQ(max_seg, kMaxDiscardSegments);
  // Write 16 KiB at sector 0, then discard sectors 8..23 (blocks 1 and 2).
  std::memset(r.at(kData), 0x77, 16384);
  r.header(kTOut, 0);
  CHECK_EQ(r.run({{kHdr, 16, false}, {kData, 16384, false}, {kStatus, 1, true}}), kSOk);
  auto discard = [&](DiscardSegment seg) {
    r.header(kTDiscard, 0);
    r.ram.mem.write_obj(kData + 0x8000, seg);
    return r.run({{kHdr, 16, false}, {kData + 0x8000, 16, false}, {kStatus, 1, true}});
  };
  CHECK_EQ(discard({8, 16, 1}), kSUnsupp);     // "unmap" is not a DISCARD flag
  CHECK_EQ(discard({2040, 16, 0}), kSIoErr);   // runs past the end
  CHECK_EQ(discard({8, 16, 0}), kSOk);
  r.header(kTIn, 0);
  CHECK_EQ(r.run({{kHdr, 16, false}, {kData + 0x10000, 16384, true}, {kStatus, 1, true}}), kSOk);
  CHECK_EQ(r.at(kData + 0x10000)[0], uint8_t{0x77});
  CHECK_EQ(r.at(kData + 0x10000)[4096], uint8_t{0});  // overlay-only disk: discarded blocks read as zeros
  CHECK_EQ(r.at(kData + 0x10000)[12288], uint8_t{0x77});
  std::filesystem::remove_all(dir);
}

TEST("virtio-blk: virtio_blk_of / virtio_blk_flush reach the disk behind a transport") {
  BlkRig r;
  CHECK(virtio_blk_of(*r.dev) != nullptr);
  CHECK_EQ(virtio_blk_flush(*r.dev), 0);
  CHECK_EQ(r.disk->flushes(), 1);
  FakeRam ram(1 << 20);
  CountingIrq irq;
  EventLoop loop;
  auto rng = make_virtio_rng(ram.mem, irq, loop);
  CHECK(virtio_blk_of(*rng) == nullptr);
  CHECK_EQ(virtio_blk_flush(*rng), -EINVAL);
}
