#include "devices/i8042/i8042.h"

#include "test/check.h"

using namespace torpor;

namespace {

struct Kbc {
  int resets = 0;
  I8042 dev{[this] { resets++; }};
  uint8_t status() {
    uint8_t v;
    dev.read(I8042::kCommandOffset, &v, 1);
    return v;
  }
  uint8_t data() {
    uint8_t v;
    dev.read(I8042::kDataOffset, &v, 1);
    return v;
  }
  void cmd(uint8_t v) { dev.write(I8042::kCommandOffset, &v, 1); }
  void put(uint8_t v) { dev.write(I8042::kDataOffset, &v, 1); }
};

class IrqRecorder : public IrqLine {
 public:
  void set_level(bool high) override { level = high; }
  void trigger() override {}
  bool level = false;
};

}  // namespace

TEST("i8042: 0xfe on the command port resets") {
  Kbc k;
  k.cmd(0xfe);
  CHECK_EQ(k.resets, 1);
  CHECK_EQ(k.dev.reset_requests(), uint64_t{1});
  k.cmd(0xff);  // pulses no line
  CHECK_EQ(k.resets, 1);
  k.cmd(0xd1);  // write output port with the reset bit clear
  k.put(0x00);
  CHECK_EQ(k.resets, 2);
}

TEST("i8042: the probe Linux makes with noaux/nomux/dumbkbd") {
  Kbc k;
  CHECK_EQ(k.status() & 0x01, 0);  // i8042_flush: nothing to drain
  k.cmd(0xaa);
  CHECK_EQ(k.status() & 0x01, 1);
  CHECK_EQ(k.data(), 0x55);
  k.cmd(0x20);
  uint8_t ctr = k.data();
  CHECK_EQ(ctr & 0x04, 0x04);  // system flag (POST passed)
  k.cmd(0x60);
  k.put(static_cast<uint8_t>((ctr & ~0x10) | 0x01));
  CHECK_EQ(k.status() & 0x08, 0);  // last write went to the data port
  k.cmd(0x20);
  CHECK_EQ(k.status() & 0x08, 0x08);
  CHECK_EQ(k.data(), static_cast<uint8_t>((ctr & ~0x10) | 0x01));
  k.cmd(0xab);
  CHECK_EQ(k.data(), 0x00);
  CHECK_EQ(k.status() & 0x01, 0);
  CHECK_EQ(k.resets, 0);
}

TEST("i8042: keyboard answers and the output buffer interrupt") {
  IrqRecorder irq;
  I8042 dev([] {}, &irq);
  auto put = [&](uint8_t port, uint8_t v) { dev.write(port, &v, 1); };
  auto get = [&] {
    uint8_t v;
    dev.read(0, &v, 1);
    return v;
  };
  put(0, 0xff);
  CHECK(irq.level);  // config byte enables keyboard interrupts by default
  CHECK_EQ(get(), 0xfa);
  CHECK_EQ(get(), 0xaa);
  CHECK(!irq.level);
  put(0, 0xf2);
  CHECK_EQ(get(), 0xfa);
  CHECK_EQ(get(), 0xab);
  CHECK_EQ(get(), 0x83);
  put(0, 0xee);
  CHECK_EQ(get(), 0xee);
  put(4, 0xd2);
  put(0, 0x1c);
  CHECK_EQ(get(), 0x1c);
  // A flood of keyboard commands stays bounded.
  for (int i = 0; i < 1000; i++) put(0, 0xf4);
  int n = 0;
  uint8_t st;
  for (;;) {
    dev.read(4, &st, 1);
    if (!(st & 1)) break;
    get();
    n++;
  }
  CHECK(n <= 16);
  uint8_t other;
  dev.read(1, &other, 1);
  CHECK_EQ(other, 0xff);
}

TEST("i8042: save/restore") {
  Kbc a;
  a.cmd(0x60);  // pending: the next data byte is the config byte
  StateWriter w;
  a.dev.save(w);
  Kbc b;
  StateReader r(w.data());
  b.dev.restore(r);
  b.put(0x05);
  b.cmd(0x20);
  CHECK_EQ(b.data(), 0x05);
  for (size_t n = 0; n < w.data().size(); n++) {
    StateReader t(w.data().data(), n);
    CHECK_THROWS_CODE(b.dev.restore(t), "SNAPSHOT_INVALID");
  }
  std::vector<uint8_t> bad = w.data();
  bad[4 + 5 + 4 + 2] = 0x99;  // pending command that takes no data
  StateReader rb(bad);
  CHECK_THROWS_CODE(b.dev.restore(rb), "SNAPSHOT_INVALID");
}
