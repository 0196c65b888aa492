#include "devices/bus.h"

#include <atomic>
#include <thread>
#include <vector>

#include "test/check.h"

using namespace torpor;

namespace {

// Records the offsets it is accessed at; reads return the low offset byte.
class RecordingDevice : public BusDevice {
 public:
  const char* name() const override { return "recording"; }
  void read(uint64_t offset, uint8_t* data, size_t len) override {
    last_offset = offset;
    for (size_t i = 0; i < len; i++) data[i] = static_cast<uint8_t>(offset + i);
    reads++;
  }
  void write(uint64_t offset, const uint8_t* data, size_t len) override {
    last_offset = offset;
    last_value = data[0];
    last_len = len;
    writes++;
  }
  void save(StateWriter&) const override {}
  void restore(StateReader&) override {}
  std::atomic<uint64_t> last_offset{~0ull};
  uint8_t last_value = 0;
  size_t last_len = 0;
  std::atomic<int> reads{0}, writes{0};
};

}  // namespace

TEST("bus: rejects zero length, overflow, null and overlap") {
  Bus bus;
  RecordingDevice a, b;
  CHECK(!bus.insert(0x1000, 0, &a));
  CHECK(!bus.insert(0x1000, 8, nullptr));
  CHECK(!bus.insert(~0ull - 3, 8, &a));        // wraps past 2^64
  CHECK(bus.insert(~0ull - 7, 8, &a));         // ends exactly at 2^64: allowed
  CHECK(bus.insert(0x3f8, 8, &a));
  CHECK(!bus.insert(0x3f8, 8, &b));            // same range
  CHECK(!bus.insert(0x3f0, 9, &b));            // overlaps the start by one byte
  CHECK(!bus.insert(0x3ff, 1, &b));            // overlaps the last byte
  CHECK(!bus.insert(0x3f9, 2, &b));            // inside
  CHECK(!bus.insert(0x3f0, 0x20, &b));         // covers it
  CHECK(bus.insert(0x3f0, 8, &b));             // touches the start: fine
  CHECK(bus.insert(0x400, 4, &b));             // touches the end: fine
  CHECK_EQ(bus.size(), size_t{4});
  CHECK(bus.remove(0x400));
  CHECK(!bus.remove(0x401));
  CHECK(bus.insert(0x400, 4, &b));
}

TEST("bus: dispatches offsets, refuses unmapped and straddling accesses") {
  Bus bus;
  RecordingDevice dev, other;
  CHECK(bus.insert(0xd0000000, 0x1000, &dev));
  CHECK(bus.insert(0xd0001000, 0x1000, &other));
  uint8_t buf[8] = {0};
  CHECK(bus.read(0xd0000050, buf, 4));
  CHECK_EQ(dev.last_offset.load(), uint64_t{0x50});
  CHECK_EQ(buf[0], uint8_t{0x50});
  uint8_t v = 0xab;
  CHECK(bus.write(0xd0000ffc, &v, 1));
  CHECK_EQ(dev.last_offset.load(), uint64_t{0xffc});
  CHECK_EQ(dev.last_value, uint8_t{0xab});
  // Straddles dev's end into other's start: refused, neither device sees it.
  int reads_before = dev.reads + other.reads;
  uint8_t poison[4] = {1, 2, 3, 4};
  CHECK(!bus.read(0xd0000ffe, poison, 4));
  CHECK_EQ(poison[0], uint8_t{1});
  CHECK_EQ(dev.reads + other.reads, reads_before);
  CHECK(!bus.write(0xd0000ffe, buf, 4));
  // Unmapped below, between nothing, above; zero-length and wrapping accesses.
  CHECK(!bus.read(0xcfffffff, buf, 1));
  CHECK(!bus.read(0xd0002000, buf, 1));
  CHECK(!bus.read(0xd0000000, buf, 0));
  CHECK(!bus.read(~0ull, buf, 2));
  uint64_t base = 0;
  CHECK(bus.device_at(0xd0001234, &base) == &other);
  CHECK_EQ(base, uint64_t{0xd0001000});
  CHECK(bus.device_at(0x10) == nullptr);
}

TEST("bus: concurrent dispatch from several threads") {
  Bus bus;
  std::vector<RecordingDevice> devs(8);
  for (size_t i = 0; i < devs.size(); i++) CHECK(bus.insert(0x1000 * i, 0x100, &devs[i]));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; t++) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20000; i++) {
        uint64_t addr = 0x1000 * ((i + t) % 8) + 0x10;
        uint8_t b[2];
        if (!bus.read(addr, b, 2) || b[0] != 0x10) failures++;
        if (bus.read(addr + 0x100, b, 1)) failures++;  // gap between ranges
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK_EQ(failures.load(), 0);
  int total = 0;
  for (auto& d : devs) total += d.reads;
  CHECK_EQ(total, 4 * 20000);
}
