#include <vector>

#include "test/check.h"
#include "base/guest_memory.h"

using namespace torpor;

TEST("guest_memory: reads and writes inside a region, refuses outside") {
  std::vector<uint8_t> ram(4 * kPageSize);
  GuestMemory mem({{0x1000, ram.size(), ram.data()}});
  uint32_t v = 0xdeadbeef;
  CHECK(mem.write_obj(0x1000 + 8, v));
  CHECK_EQ(*mem.read_obj<uint32_t>(0x1008), 0xdeadbeefu);
  CHECK(!mem.read_obj<uint32_t>(0x0ffe));                  // starts before the region
  CHECK(!mem.read_obj<uint32_t>(0x1000 + ram.size() - 2)); // runs past its end
  CHECK(!mem.write_obj<uint64_t>(~uint64_t{0} - 3, 1));    // wraps around
  CHECK(mem.host_ptr(0x1000, ram.size()) == ram.data());
  CHECK(mem.host_ptr(0x1000, ram.size() + 1) == nullptr);
}

TEST("guest_memory: VMM writes are recorded as dirty pages and cleared when taken") {
  std::vector<uint8_t> ram(130 * kPageSize);
  GuestMemory mem({{0, ram.size(), ram.data()}});
  uint8_t buf[8] = {};
  CHECK(mem.write(kPageSize - 4, buf, 8));  // straddles pages 0 and 1
  CHECK(mem.write(129 * kPageSize, buf, 1));
  auto bits = mem.take_dirty(0);
  CHECK_EQ(bits.size(), size_t{3});
  CHECK_EQ(bits[0], uint64_t{3});
  CHECK_EQ(bits[2], uint64_t{1} << 1);
  auto again = mem.take_dirty(0);
  CHECK_EQ(again[0], uint64_t{0});
}

TEST("guest_memory: overlapping or unaligned regions are refused") {
  std::vector<uint8_t> a(2 * kPageSize), b(2 * kPageSize);
  GuestMemory mem;
  CHECK(mem.add_region({0, a.size(), a.data()}));
  CHECK(!mem.add_region({kPageSize, b.size(), b.data()}));
  CHECK(!mem.add_region({0x10010, b.size(), b.data()}));
  CHECK(mem.add_region({0x10000, b.size(), b.data()}));
}
