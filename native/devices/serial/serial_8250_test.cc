#include "devices/serial/serial_8250.h"

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "test/check.h"

using namespace torpor;

namespace {

class IrqRecorder : public IrqLine {
 public:
  void set_level(bool high) override {
    level = high;
    if (high) rises++;
  }
  void trigger() override { triggers++; }
  bool level = false;
  int rises = 0;
  int triggers = 0;
};

struct Uart {
  IrqRecorder irq;
  std::string out;
  Serial8250 dev{irq, [this](const uint8_t* d, size_t n) { out.append(reinterpret_cast<const char*>(d), n); }};
  uint8_t in(uint8_t reg) {
    uint8_t v;
    dev.read(reg, &v, 1);
    return v;
  }
  void outb(uint8_t reg, uint8_t v) { dev.write(reg, &v, 1); }
};

constexpr uint8_t THR = 0, IER = 1, IIR = 2, FCR = 2, LCR = 3, MCR = 4, LSR = 5, MSR = 6, SCR = 7;

}  // namespace

TEST("serial: output goes to the sink, LSR says the transmitter is empty") {
  Uart u;
  for (char c : std::string("hello\n")) u.outb(THR, static_cast<uint8_t>(c));
  CHECK(u.out == "hello\n");
  CHECK_EQ(u.in(LSR) & 0x60, 0x60);
  CHECK_EQ(u.in(LSR) & 0x01, 0);  // no data
  CHECK(!u.irq.level);            // no interrupt enabled
}

TEST("serial: DLAB switches offsets 0/1 to the divisor latch") {
  Uart u;
  u.outb(LCR, 0x83);
  u.outb(0, 0x01);
  u.outb(1, 0x00);
  CHECK_EQ(u.in(0), 0x01);
  CHECK_EQ(u.in(1), 0x00);
  CHECK(u.out.empty());  // the divisor write did not transmit
  u.outb(LCR, 0x03);
  CHECK_EQ(u.in(IER), 0x00);
  CHECK_EQ(u.in(LCR), 0x03);
  u.outb(SCR, 0x5a);
  CHECK_EQ(u.in(SCR), 0x5a);
}

TEST("serial: input, data-available interrupt, bounded FIFO") {
  Uart u;
  u.outb(IER, 0x01);
  CHECK(!u.irq.level);
  const uint8_t msg[] = {'a', 'b'};
  CHECK_EQ(u.dev.enqueue_input(msg, 2), size_t{2});
  CHECK(u.irq.level);
  CHECK_EQ(u.in(IIR) & 0x0f, 0x04);
  CHECK_EQ(u.in(LSR) & 0x01, 0x01);
  CHECK_EQ(u.in(0), 'a');
  CHECK(u.irq.level);
  CHECK_EQ(u.in(0), 'b');
  CHECK(!u.irq.level);
  CHECK_EQ(u.in(IIR) & 0x0f, 0x01);
  std::vector<uint8_t> big(Serial8250::kRxCapacity + 100, 'x');
  CHECK_EQ(u.dev.enqueue_input(big.data(), big.size()), Serial8250::kRxCapacity);
  CHECK_EQ(u.dev.input_space(), size_t{0});
  CHECK_EQ(u.dev.enqueue_input(big.data(), 1), size_t{0});
  u.outb(FCR, 0x03);  // enable + clear RX
  CHECK_EQ(u.dev.input_space(), Serial8250::kRxCapacity);
  CHECK_EQ(u.in(IIR) & 0xc0, 0xc0);  // FIFO enabled: a 16550A to Linux's probe
}

TEST("serial: THR-empty interrupt raised on enable, acked by IIR, re-raised by THR write") {
  Uart u;
  u.outb(IER, 0x02);
  CHECK(u.irq.level);
  CHECK_EQ(u.in(IIR) & 0x0f, 0x02);
  CHECK(!u.irq.level);  // reading IIR acknowledged it
  CHECK_EQ(u.in(IIR) & 0x0f, 0x01);
  int rises = u.irq.rises;
  u.outb(THR, 'x');
  CHECK(u.irq.level);
  CHECK_EQ(u.irq.rises, rises + 1);
  u.outb(IER, 0x00);
  CHECK(!u.irq.level);
}

TEST("serial: loopback returns transmitted bytes and wires MCR to MSR") {
  Uart u;
  u.outb(MCR, 0x1a);  // LOOP | OUT2 | RTS: Linux's loopback probe
  CHECK_EQ(u.in(MSR) & 0xf0, 0x90);
  u.outb(IER, 0x01);
  u.outb(THR, 'L');
  CHECK(u.out.empty());
  CHECK(u.irq.level);
  CHECK_EQ(u.in(0), 'L');
  u.outb(MCR, 0x00);
  CHECK_EQ(u.in(MSR) & 0xf0, 0xb0);  // out of loopback: carrier, DSR, CTS
}

TEST("serial: modem status deltas and interrupt") {
  Uart u;
  u.outb(MCR, 0x10);
  (void)u.in(MSR);
  u.outb(IER, 0x08);
  u.outb(MCR, 0x11);  // DTR -> DSR changes
  CHECK(u.irq.level);
  CHECK_EQ(u.in(IIR) & 0x0f, 0x00);
  uint8_t msr = u.in(MSR);
  CHECK_EQ(msr & 0x02, 0x02);
  CHECK_EQ(msr & 0x20, 0x20);
  CHECK(!u.irq.level);
  CHECK_EQ(u.in(MSR) & 0x0f, 0);
}

TEST("serial: overrun in loopback sets LSR.OE and the line-status interrupt") {
  Uart u;
  u.outb(MCR, 0x10);
  std::vector<uint8_t> fill(Serial8250::kRxCapacity, 'f');
  CHECK_EQ(u.dev.enqueue_input(fill.data(), fill.size()), Serial8250::kRxCapacity);
  u.outb(IER, 0x04);
  u.outb(THR, 'z');
  CHECK(u.irq.level);
  CHECK_EQ(u.in(IIR) & 0x0f, 0x06);
  CHECK_EQ(u.in(LSR) & 0x02, 0x02);
  CHECK_EQ(u.in(LSR) & 0x02, 0x00);  // cleared by the read
  CHECK(!u.irq.level);
}

TEST("serial: wide accesses touch consecutive registers") {
  Uart u;
  const uint8_t two[2] = {'w', 0x01};  // THR then IER
  u.dev.write(0, two, 2);
  CHECK(u.out == "w");
  CHECK_EQ(u.in(IER), 0x01);
  uint8_t r[2];
  u.dev.read(7, r, 2);
  CHECK_EQ(r[1], 0xff);
}

TEST("serial: save/restore round trip and validation") {
  Uart a;
  a.outb(LCR, 0x83);
  a.outb(0, 0x0c);
  a.outb(LCR, 0x03);
  a.outb(IER, 0x01);
  a.outb(SCR, 0x77);
  a.outb(FCR, 0x01);
  const uint8_t msg[] = {'q', 'r'};
  a.dev.enqueue_input(msg, 2);
  StateWriter w;
  a.dev.save(w);

  Uart b;
  StateReader r(w.data());
  b.dev.restore(r);
  CHECK_EQ(r.remaining(), size_t{0});
  CHECK_EQ(b.in(SCR), 0x77);
  CHECK_EQ(b.in(IER), 0x01);
  CHECK_EQ(b.in(IIR), 0xc4);
  CHECK_EQ(b.in(0), 'q');
  CHECK_EQ(b.in(0), 'r');
  b.outb(LCR, 0x83);
  CHECK_EQ(b.in(0), 0x0c);

  // Truncated at every length: refused, and the device keeps working.
  for (size_t n = 0; n < w.data().size(); n++) {
    Uart c;
    StateReader t(w.data().data(), n);
    CHECK_THROWS_CODE(c.dev.restore(t), "SNAPSHOT_INVALID");
    c.outb(THR, 'k');
    CHECK(c.out == "k");
  }
  // Another device's tag, reserved bits.
  StateWriter other;
  other.header("i8042", 1);
  StateReader ro(other.data());
  CHECK_THROWS_CODE(b.dev.restore(ro), "SNAPSHOT_INVALID");
  std::vector<uint8_t> bad = w.data();
  bad[4 + 10 + 4] = 0xf1;  // IER follows the header (u32 len + "serial8250" + u32 version)
  StateReader rb(bad);
  CHECK_THROWS_CODE(b.dev.restore(rb), "SNAPSHOT_INVALID");
  CHECK_EQ(b.in(SCR), 0x77);  // unchanged by the refused restore
}

TEST("serial: input from the host thread while a vCPU thread drains it, in order") {
  Uart u;
  const size_t total = 100000;
  std::thread host([&] {
    size_t sent = 0;
    while (sent < total) {
      uint8_t chunk[64];
      size_t n = std::min<size_t>(sizeof chunk, total - sent);
      for (size_t i = 0; i < n; i++) chunk[i] = static_cast<uint8_t>((sent + i) % 251);
      size_t took = u.dev.enqueue_input(chunk, n);
      sent += took;
      if (took < n) std::this_thread::yield();
    }
  });
  size_t got = 0;
  bool in_order = true;
  while (got < total) {
    if (!(u.in(LSR) & 0x01)) continue;
    uint8_t b = u.in(0);
    if (b != got % 251) in_order = false;
    got++;
  }
  host.join();
  CHECK(in_order);
  CHECK_EQ(u.dev.input_space(), Serial8250::kRxCapacity);
}
