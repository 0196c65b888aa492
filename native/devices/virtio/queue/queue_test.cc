// The split virtqueue against the driver-side mock over fake guest memory:
// well-formed chains, every kind of malformed chain, EVENT_IDX, save/restore.
#include <chrono>
#include <cstdio>
#include <cstring>

#include "devices/virtio/queue/mock.h"
#include "devices/virtio/queue/queue.h"
#include "test/check.h"

using namespace torpor;
using torpor::testing::FakeRam;
using torpor::testing::MockDriverQueue;
using virtio::Descriptor;

namespace {

constexpr uint64_t kRings = 0x10000;
constexpr uint64_t kData = 0x40000;

// 1 MiB of RAM at 0, then an MMIO hole, then 1 MiB more at 2 MiB.
struct TwoRegionRam {
  std::vector<uint8_t> low = std::vector<uint8_t>(1 << 20), high = std::vector<uint8_t>(1 << 20);
  GuestMemory mem;
  TwoRegionRam() {
    mem.add_region({0, low.size(), low.data()});
    mem.add_region({2 << 20, high.size(), high.data()});
  }
};

struct Fixture {
  explicit Fixture(uint16_t size = 16, bool event_idx = false, bool indirect = true)
      : driver(ram.mem, kRings, size), q(size) {
    driver.configure(q, event_idx, indirect);
    CHECK(q.validate(ram.mem) == nullptr);
  }
  TwoRegionRam ram;
  MockDriverQueue driver;
  Virtqueue q;
  DescriptorChain chain;
  PopStatus pop() { return q.pop(ram.mem, chain); }
  void expect_broken(const char* fragment) {
    CHECK(pop() == PopStatus::kBroken);
    CHECK(q.broken());
    if (!std::strstr(q.error().c_str(), fragment))
      ::torpor_test::fail(__FILE__, __LINE__, "error '" + q.error() + "' lacks '" + fragment + "'");
    CHECK(pop() == PopStatus::kBroken);  // stays broken
  }
};

}  // namespace

TEST("virtqueue: pops a chain, splits readable from writable, returns it on the used ring") {
  Fixture f;
  CHECK(f.pop() == PopStatus::kEmpty);
  uint16_t head = f.driver.add_chain({{kData, 16, false}, {kData + 0x1000, 512, true}, {kData + 0x2000, 1, true}});
  CHECK(f.pop() == PopStatus::kChain);
  CHECK_EQ(f.chain.head(), head);
  CHECK_EQ(f.chain.readable().size(), size_t{1});
  CHECK_EQ(f.chain.writable().size(), size_t{2});
  CHECK_EQ(f.chain.readable_bytes(), uint64_t{16});
  CHECK_EQ(f.chain.writable_bytes(), uint64_t{513});
  CHECK(f.pop() == PopStatus::kEmpty);
  CHECK(f.q.add_used(f.ram.mem, head, 513));
  CHECK_EQ(f.driver.used_idx(), uint16_t{1});
  CHECK_EQ(f.driver.used(0).id, uint32_t{head});
  CHECK_EQ(f.driver.used(0).len, uint32_t{513});
}

TEST("virtqueue: chain read/write span buffers and refuse to run past the chain") {
  Fixture f;
  f.driver.add_chain({{kData, 3, false}, {kData + 100, 5, false}, {kData + 200, 2, true}, {kData + 300, 4, true}});
  std::memcpy(f.ram.low.data() + kData, "abc", 3);
  std::memcpy(f.ram.low.data() + kData + 100, "defgh", 5);
  CHECK(f.pop() == PopStatus::kChain);
  char buf[8] = {};
  CHECK(f.chain.read(f.ram.mem, 1, buf, 6));
  CHECK(std::memcmp(buf, "bcdefg", 6) == 0);
  CHECK(!f.chain.read(f.ram.mem, 4, buf, 5));  // only 4 bytes left
  CHECK(f.chain.write(f.ram.mem, 1, "XYZ", 3));
  CHECK_EQ(f.ram.low[kData + 201], uint8_t{'X'});
  CHECK_EQ(f.ram.low[kData + 300], uint8_t{'Y'});
  CHECK(!f.chain.write(f.ram.mem, 4, "12345", 5));
}

TEST("virtqueue: a descriptor loop is caught and breaks the queue") {
  Fixture f(4);
  f.driver.write_desc(0, {kData, 8, virtio::kDescFNext, 1});
  f.driver.write_desc(1, {kData, 8, virtio::kDescFNext, 2});
  f.driver.write_desc(2, {kData, 8, virtio::kDescFNext, 0});
  f.driver.publish(0);
  f.expect_broken("longer than the queue");
}

TEST("virtqueue: a self-loop in a maximum-size queue is bounded too") {
  Fixture f(256);
  f.driver.write_desc(7, {kData, 8, virtio::kDescFNext, 7});
  f.driver.publish(7);
  f.expect_broken("longer than the queue");
}

TEST("virtqueue: head and next indices beyond the queue size are refused") {
  {
    Fixture f(16);
    f.driver.publish(16);
    f.expect_broken("index out of range");
  }
  {
    Fixture f(16);
    f.driver.write_desc(0, {kData, 8, virtio::kDescFNext, 999});
    f.driver.publish(0);
    f.expect_broken("index out of range");
  }
}

TEST("virtqueue: zero-length descriptors are refused") {
  Fixture f;
  f.driver.add_chain({{kData, 16, false}, {kData + 16, 0, true}});
  f.expect_broken("zero-length");
}

TEST("virtqueue: buffers outside RAM, in the MMIO hole, straddling it or wrapping are refused") {
  const uint64_t bad[][2] = {
      {(1 << 20) + 0x1000, 16},       // in the hole between the regions
      {(1 << 20) - 8, 16},            // runs off the end of the low region into the hole
      {0xd0000000, 4},                // the virtio-mmio window
      {~uint64_t{0} - 4, 16},         // wraps around
      {(3 << 20), 1},                 // just past the high region
  };
  for (const auto& b : bad) {
    Fixture f;
    f.driver.add_chain({{b[0], static_cast<uint32_t>(b[1]), false}});
    f.expect_broken("outside RAM");
  }
  Fixture ok;
  ok.driver.add_chain({{(2 << 20) + 64, 4096, true}});  // the high region is fine
  CHECK(ok.pop() == PopStatus::kChain);
}

TEST("virtqueue: a readable buffer after a writable one is refused") {
  Fixture f;
  f.driver.add_chain({{kData, 16, true}, {kData + 16, 16, false}});
  f.expect_broken("after a device-writable");
}

TEST("virtqueue: the available index may not run ahead by more than the queue size") {
  Fixture f(8);
  f.driver.set_avail_idx(9);
  f.expect_broken("more than the queue size");
}

TEST("virtqueue: indirect tables are followed when negotiated") {
  Fixture f(8, false, true);
  uint64_t table = kData + 0x8000;
  uint16_t head = f.driver.add_indirect_chain(table, {{kData, 16, false}, {kData + 0x1000, 4096, true},
                                                      {kData + 0x2000, 1, true}});
  CHECK(f.pop() == PopStatus::kChain);
  CHECK_EQ(f.chain.head(), head);
  CHECK_EQ(f.chain.readable_bytes(), uint64_t{16});
  CHECK_EQ(f.chain.writable_bytes(), uint64_t{4097});
}

TEST("virtqueue: malformed indirect descriptors are refused") {
  uint64_t table = kData + 0x8000;
  {
    Fixture f(8, false, false);  // not negotiated
    f.driver.add_indirect_chain(table, {{kData, 16, false}});
    f.expect_broken("without VIRTIO_RING_F_INDIRECT_DESC");
  }
  {
    Fixture f;
    f.driver.write_desc(0, {table, 24, virtio::kDescFIndirect, 0});  // not a multiple of 16
    f.driver.publish(0);
    f.expect_broken("bad indirect table length");
  }
  {
    Fixture f;
    f.driver.write_desc(0, {table, 16 * (virtio::kMaxIndirect + 1), virtio::kDescFIndirect, 0});
    f.driver.publish(0);
    f.expect_broken("bad indirect table length");
  }
  {
    Fixture f;
    f.driver.write_desc(0, {table, 16, virtio::kDescFIndirect | virtio::kDescFNext, 1});
    f.driver.publish(0);
    f.expect_broken("with NEXT");
  }
  {
    Fixture f;
    f.driver.write_desc(0, {(1 << 20) + 0x100, 32, virtio::kDescFIndirect, 0});  // table in the hole
    f.driver.publish(0);
    f.expect_broken("indirect table is outside RAM");
  }
  {
    Fixture f;  // nested: the table's entry is itself indirect
    f.ram.mem.write_obj(table, Descriptor{table + 0x100, 16, virtio::kDescFIndirect, 0});
    f.driver.write_desc(0, {table, 16, virtio::kDescFIndirect, 0});
    f.driver.publish(0);
    f.expect_broken("nested");
  }
  {
    Fixture f;  // a loop inside the table
    f.ram.mem.write_obj(table, Descriptor{kData, 8, virtio::kDescFNext, 1});
    f.ram.mem.write_obj(table + 16, Descriptor{kData, 8, virtio::kDescFNext, 0});
    f.driver.write_desc(0, {table, 32, virtio::kDescFIndirect, 0});
    f.driver.publish(0);
    f.expect_broken("longer than the queue");
  }
  {
    Fixture f;  // an indirect descriptor in the middle of a direct chain
    f.driver.write_desc(0, {kData, 8, virtio::kDescFNext, 1});
    f.driver.write_desc(1, {table, 16, virtio::kDescFIndirect, 0});
    f.ram.mem.write_obj(table, Descriptor{kData, 8, 0, 0});
    f.driver.publish(0);
    f.expect_broken("inside a chain");
  }
}

TEST("virtqueue: validate refuses bad sizes, misaligned rings and rings outside RAM") {
  TwoRegionRam ram;
  Virtqueue q(16);
  MockDriverQueue d(ram.mem, kRings, 16);
  d.configure(q);
  CHECK(q.validate(ram.mem) == nullptr);
  q.set_size(12);
  CHECK(q.validate(ram.mem) != nullptr);
  q.set_size(32);  // above max
  CHECK(q.validate(ram.mem) != nullptr);
  q.set_size(0);
  CHECK(q.validate(ram.mem) != nullptr);
  q.set_size(16);
  q.set_desc_table(kRings + 8);
  CHECK(q.validate(ram.mem) != nullptr);
  q.set_desc_table((1 << 20) - 16 * 8);  // runs into the hole
  CHECK(q.validate(ram.mem) != nullptr);
  q.set_desc_table(kRings);
  q.set_used_ring(0xd0000000);
  CHECK(q.validate(ram.mem) != nullptr);
}

TEST("virtqueue: EVENT_IDX suppresses interrupts until used_event is passed") {
  Fixture f(16, true);
  f.driver.set_used_event(2);  // interrupt when used->idx moves past 2
  for (int i = 0; i < 4; i++) f.driver.add_chain({{kData + 64u * i, 64, true}});
  std::vector<bool> irq;
  for (int i = 0; i < 4; i++) {
    CHECK(f.pop() == PopStatus::kChain);
    CHECK(f.q.add_used(f.ram.mem, f.chain.head(), 64));
    irq.push_back(f.q.needs_interrupt(f.ram.mem));
  }
  // The first call always interrupts (nothing signalled yet); then only the
  // step from used idx 2 to 3 crosses used_event.
  CHECK(irq[0]);
  CHECK(!irq[1]);
  CHECK(irq[2]);
  CHECK(!irq[3]);
  // Nothing new used: no interrupt.
  CHECK(!f.q.needs_interrupt(f.ram.mem));
  // Draining publishes avail_event = next avail index, so the driver kicks next time.
  CHECK(f.pop() == PopStatus::kEmpty);
  CHECK_EQ(f.driver.avail_event(), uint16_t{4});
}

TEST("virtqueue: EVENT_IDX re-checks after publishing avail_event and finds a racing buffer") {
  Fixture f(16, true);
  CHECK(f.pop() == PopStatus::kEmpty);
  CHECK_EQ(f.driver.avail_event(), uint16_t{0});
  f.driver.add_chain({{kData, 8, true}});
  CHECK(f.q.has_available(f.ram.mem));
  CHECK(f.pop() == PopStatus::kChain);
  f.q.undo_pop();  // give it back: served again next time
  CHECK(f.pop() == PopStatus::kChain);
  CHECK(f.pop() == PopStatus::kEmpty);
  CHECK_EQ(f.driver.avail_event(), uint16_t{1});
}

TEST("virtqueue: without EVENT_IDX, VRING_AVAIL_F_NO_INTERRUPT suppresses interrupts") {
  Fixture f(16, false);
  f.driver.add_chain({{kData, 8, true}});
  f.driver.add_chain({{kData, 8, true}});
  CHECK(f.pop() == PopStatus::kChain);
  CHECK(f.q.add_used(f.ram.mem, f.chain.head(), 8));
  CHECK(f.q.needs_interrupt(f.ram.mem));
  f.driver.set_avail_flags(virtio::kAvailFNoInterrupt);
  CHECK(f.pop() == PopStatus::kChain);
  CHECK(f.q.add_used(f.ram.mem, f.chain.head(), 8));
  CHECK(!f.q.needs_interrupt(f.ram.mem));
}

TEST("virtqueue: used-ring writes are recorded as dirty pages") {
  Fixture f;
  f.ram.mem.take_dirty(0);
  f.driver.add_chain({{kData, 8, true}});
  CHECK(f.pop() == PopStatus::kChain);
  CHECK(f.q.add_used(f.ram.mem, f.chain.head(), 8));
  auto bits = f.ram.mem.take_dirty(0);
  uint64_t page = f.driver.used_ring() / kPageSize;
  CHECK(bits[page / 64] & (uint64_t{1} << (page % 64)));
}

TEST("virtqueue: save/restore keeps indices; malformed state is refused") {
  Fixture f(16, true);
  f.driver.add_chain({{kData, 8, true}});
  f.driver.add_chain({{kData, 8, true}});
  CHECK(f.pop() == PopStatus::kChain);
  CHECK(f.q.add_used(f.ram.mem, f.chain.head(), 8));
  StateWriter w;
  f.q.save(w);
  Virtqueue r(16);
  StateReader in(w.data());
  r.restore(in);
  in.expect_end();
  CHECK_EQ(r.size(), uint16_t{16});
  CHECK_EQ(r.next_avail(), uint16_t{1});
  CHECK_EQ(r.next_used(), uint16_t{1});
  CHECK(r.ready());
  CHECK(r.event_idx());
  CHECK(r.pop(f.ram.mem, f.chain) == PopStatus::kChain);  // continues with the second chain
  CHECK(r.pop(f.ram.mem, f.chain) == PopStatus::kEmpty);

  Virtqueue other(32);  // another QueueNumMax
  StateReader in2(w.data());
  CHECK_THROWS_CODE(other.restore(in2), "SNAPSHOT_INVALID");
  auto bytes = w.data();
  bytes.resize(bytes.size() - 3);
  StateReader in3(bytes);
  Virtqueue t(16);
  CHECK_THROWS_CODE(t.restore(in3), "SNAPSHOT_INVALID");
  // A size that is not a power of two.
  auto bad = w.data();
  size_t size_at = 4 + std::strlen("virtqueue") + 4 + 2;  // tag, version, max_size
  bad[size_at] = 12;
  bad[size_at + 1] = 0;
  StateReader in4(bad);
  CHECK_THROWS_CODE(t.restore(in4), "SNAPSHOT_INVALID");
}

TEST("virtqueue: reset returns to power-on state and clears a broken queue") {
  Fixture f;
  f.driver.publish(99);
  CHECK(f.pop() == PopStatus::kBroken);
  f.q.reset();
  CHECK(!f.q.broken());
  CHECK(!f.q.ready());
  CHECK_EQ(f.q.size(), uint16_t{16});
  CHECK_EQ(f.q.next_avail(), uint16_t{0});
}

TEST("virtqueue: bench pop + add_used (printed, not asserted)") {
  FakeRam ram(1 << 20);
  const uint16_t size = 256;
  MockDriverQueue d(ram.mem, kRings, size);
  Virtqueue q(size);
  d.configure(q, true);
  DescriptorChain chain;
  // Three-descriptor chains, like a block request: 85 fit in 256 descriptors.
  std::vector<uint16_t> heads;
  for (int i = 0; i < size / 3; i++)
    heads.push_back(d.add_chain({{kData, 16, false}, {kData + 4096, 4096, true}, {kData + 64, 1, true}}));
  const int rounds = 4000;
  double ns = 0;
  long ops = 0;
  for (int r = 0; r < rounds; r++) {
    if (r > 0)
      for (uint16_t h : heads) d.publish(h);  // the driver re-offers them (not timed)
    auto t0 = std::chrono::steady_clock::now();
    while (q.pop(ram.mem, chain) == PopStatus::kChain) {
      q.add_used(ram.mem, chain.head(), 4097);
      ops++;
    }
    q.needs_interrupt(ram.mem);
    ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
  std::printf("  bench: virtqueue pop+add_used of a 3-descriptor chain: %.0f ns/op (%ld ops; %s)\n",
              ns / ops, ops, torpor_test::kBuildKind);
  CHECK(ops == long{rounds} * static_cast<long>(heads.size()));
}
