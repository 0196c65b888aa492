#include "devices/serial/serial_8250.h"

#include <algorithm>
#include <vector>

namespace torpor {
namespace {

// Register offsets (DLAB = 0 unless noted).
constexpr uint8_t kRbrThr = 0;  // DLL when DLAB
constexpr uint8_t kIer = 1;     // DLM when DLAB
constexpr uint8_t kIirFcr = 2;
constexpr uint8_t kLcr = 3;
constexpr uint8_t kMcr = 4;
constexpr uint8_t kLsr = 5;
constexpr uint8_t kMsr = 6;
constexpr uint8_t kScr = 7;

constexpr uint8_t kIerRda = 0x01;   // received data available
constexpr uint8_t kIerThre = 0x02;  // transmitter holding register empty
constexpr uint8_t kIerRls = 0x04;   // receiver line status
constexpr uint8_t kIerMsi = 0x08;   // modem status
constexpr uint8_t kIerMask = 0x0f;

constexpr uint8_t kIirNone = 0x01;
constexpr uint8_t kIirMsi = 0x00;
constexpr uint8_t kIirThre = 0x02;
constexpr uint8_t kIirRda = 0x04;
constexpr uint8_t kIirRls = 0x06;
constexpr uint8_t kIirFifoBits = 0xc0;

constexpr uint8_t kFcrEnable = 0x01;
constexpr uint8_t kFcrClearRx = 0x02;

constexpr uint8_t kLcrDlab = 0x80;

constexpr uint8_t kMcrDtr = 0x01;
constexpr uint8_t kMcrRts = 0x02;
constexpr uint8_t kMcrOut1 = 0x04;
constexpr uint8_t kMcrOut2 = 0x08;
constexpr uint8_t kMcrLoop = 0x10;
constexpr uint8_t kMcrMask = 0x1f;

constexpr uint8_t kLsrDr = 0x01;
constexpr uint8_t kLsrOe = 0x02;
constexpr uint8_t kLsrThre = 0x20;
constexpr uint8_t kLsrTemt = 0x40;

constexpr uint8_t kMsrCts = 0x10;
constexpr uint8_t kMsrDsr = 0x20;
constexpr uint8_t kMsrRi = 0x40;
constexpr uint8_t kMsrDcd = 0x80;
constexpr uint8_t kMsrDctsBit = 0x01, kMsrDdsrBit = 0x02, kMsrTeriBit = 0x04, kMsrDdcdBit = 0x08;

constexpr const char* kStateTag = "serial8250";
constexpr uint32_t kStateVersion = 1;

}  // namespace

Serial8250::Serial8250(IrqLine& irq, OutputSink output) : irq_(irq), output_(std::move(output)) {}

uint8_t Serial8250::msr_status() const {
  if (r_.mcr & kMcrLoop) {
    // Loopback wires the modem-control outputs back to the status inputs.
    uint8_t s = 0;
    if (r_.mcr & kMcrRts) s |= kMsrCts;
    if (r_.mcr & kMcrDtr) s |= kMsrDsr;
    if (r_.mcr & kMcrOut1) s |= kMsrRi;
    if (r_.mcr & kMcrOut2) s |= kMsrDcd;
    return s;
  }
  // A permanently connected line, so guests never wait for carrier.
  return kMsrCts | kMsrDsr | kMsrDcd;
}

uint8_t Serial8250::lsr() const {
  uint8_t v = kLsrThre | kLsrTemt;  // transmission is instantaneous
  if (!rx_.empty()) v |= kLsrDr;
  if (r_.overrun) v |= kLsrOe;
  return v;
}

uint8_t Serial8250::iir() const {
  uint8_t fifo = r_.fifo_enabled ? kIirFifoBits : 0;
  if ((r_.ier & kIerRls) && r_.overrun) return kIirRls | fifo;
  if ((r_.ier & kIerRda) && !rx_.empty()) return kIirRda | fifo;
  if ((r_.ier & kIerThre) && r_.thre_pending) return kIirThre | fifo;
  if ((r_.ier & kIerMsi) && r_.msr_delta) return kIirMsi | fifo;
  return kIirNone | fifo;
}

void Serial8250::update_irq() {
  bool high = (iir() & kIirNone) == 0;
  if (high != line_high_) {
    line_high_ = high;
    irq_.set_level(high);
  }
}

void Serial8250::push_rx(uint8_t byte) {
  if (rx_.size() >= kRxCapacity) {
    r_.overrun = true;
    return;
  }
  rx_.push_back(byte);
}

void Serial8250::set_mcr(uint8_t value) {
  uint8_t before = msr_status();
  r_.mcr = value & kMcrMask;
  uint8_t after = msr_status();
  uint8_t changed = before ^ after;
  if (changed & kMsrCts) r_.msr_delta |= kMsrDctsBit;
  if (changed & kMsrDsr) r_.msr_delta |= kMsrDdsrBit;
  if ((before & kMsrRi) && !(after & kMsrRi)) r_.msr_delta |= kMsrTeriBit;  // trailing edge only
  if (changed & kMsrDcd) r_.msr_delta |= kMsrDdcdBit;
}

uint8_t Serial8250::read_reg(uint8_t reg) {
  bool dlab = r_.lcr & kLcrDlab;
  switch (reg) {
    case kRbrThr: {
      if (dlab) return r_.dll;
      if (rx_.empty()) return 0;
      uint8_t b = rx_.front();
      rx_.pop_front();
      return b;
    }
    case kIer:
      return dlab ? r_.dlm : r_.ier;
    case kIirFcr: {
      uint8_t v = iir();
      // Reading IIR acknowledges a THR-empty interrupt (and only that one).
      if ((v & 0x0f) == kIirThre) r_.thre_pending = false;
      return v;
    }
    case kLcr:
      return r_.lcr;
    case kMcr:
      return r_.mcr;
    case kLsr: {
      uint8_t v = lsr();
      r_.overrun = false;
      return v;
    }
    case kMsr: {
      uint8_t v = msr_status() | r_.msr_delta;
      r_.msr_delta = 0;
      return v;
    }
    case kScr:
      return r_.scr;
    default:
      return 0xff;
  }
}

void Serial8250::write_reg(uint8_t reg, uint8_t value) {
  bool dlab = r_.lcr & kLcrDlab;
  switch (reg) {
    case kRbrThr:
      if (dlab) {
        r_.dll = value;
        return;
      }
      if (r_.mcr & kMcrLoop) {
        push_rx(value);
      } else if (output_) {
        output_(&value, 1);
      }
      r_.thre_pending = true;  // sent at once: THR is empty again
      return;
    case kIer:
      if (dlab) {
        r_.dlm = value;
        return;
      }
      // Enabling the THR-empty interrupt while THR is empty raises it at once
      // (drivers rely on this to start transmitting).
      if ((value & kIerThre) && !(r_.ier & kIerThre)) r_.thre_pending = true;
      r_.ier = value & kIerMask;
      return;
    case kIirFcr:
      r_.fifo_enabled = value & kFcrEnable;
      if (value & kFcrClearRx) rx_.clear();
      return;
    case kLcr:
      r_.lcr = value;
      return;
    case kMcr:
      set_mcr(value);
      return;
    case kScr:
      r_.scr = value;
      return;
    default:
      return;  // LSR and MSR are read-only
  }
}

void Serial8250::read(uint64_t offset, uint8_t* data, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  // A wider access reads consecutive registers, as on the ISA bus.
  for (size_t i = 0; i < len; i++) {
    uint64_t reg = offset + i;
    data[i] = reg < kRangeLen ? read_reg(static_cast<uint8_t>(reg)) : 0xff;
  }
  update_irq();
}

void Serial8250::write(uint64_t offset, const uint8_t* data, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < len; i++) {
    uint64_t reg = offset + i;
    if (reg < kRangeLen) write_reg(static_cast<uint8_t>(reg), data[i]);
  }
  update_irq();
}

size_t Serial8250::enqueue_input(const uint8_t* data, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = std::min(len, kRxCapacity - rx_.size());
  rx_.insert(rx_.end(), data, data + n);
  update_irq();
  return n;
}

size_t Serial8250::input_space() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kRxCapacity - rx_.size();
}

void Serial8250::save(StateWriter& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  out.header(kStateTag, kStateVersion);
  out.u8(r_.ier);
  out.u8(r_.lcr);
  out.u8(r_.mcr);
  out.u8(r_.scr);
  out.u8(r_.dll);
  out.u8(r_.dlm);
  out.boolean(r_.fifo_enabled);
  out.boolean(r_.overrun);
  out.u8(r_.msr_delta);
  out.boolean(r_.thre_pending);
  std::vector<uint8_t> rx(rx_.begin(), rx_.end());
  out.bytes(rx.data(), rx.size());
}

void Serial8250::restore(StateReader& in) {
  // Parse everything first: a bad blob leaves the device as it was.
  in.expect_header(kStateTag, kStateVersion, kStateVersion);
  Regs r;
  r.ier = in.u8();
  r.lcr = in.u8();
  r.mcr = in.u8();
  r.scr = in.u8();
  r.dll = in.u8();
  r.dlm = in.u8();
  r.fifo_enabled = in.boolean();
  r.overrun = in.boolean();
  r.msr_delta = in.u8();
  r.thre_pending = in.boolean();
  std::vector<uint8_t> rx = in.bytes(kRxCapacity);
  if (r.ier & ~kIerMask) StateReader::fail("serial8250: IER has reserved bits set");
  if (r.mcr & ~kMcrMask) StateReader::fail("serial8250: MCR has reserved bits set");
  if (r.msr_delta & 0xf0) StateReader::fail("serial8250: bad MSR delta bits");

  std::lock_guard<std::mutex> lock(mu_);
  r_ = r;
  rx_.assign(rx.begin(), rx.end());
  // The interrupt controller's own state is restored by the machine; only
  // resynchronise our idea of the line so the next change is an edge.
  line_high_ = (iir() & kIirNone) == 0;
}

}  // namespace torpor
