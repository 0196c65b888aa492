// A 16550A-compatible UART (the PC's COM1 at I/O ports 0x3f8-0x3ff, IRQ 4).
//
// Map it as one 8-byte range: offsets 0..7 are the UART's registers.
// Transmission is instantaneous: a byte written to THR goes straight to the
// output sink (or, in loopback mode, back into the receive FIFO), so LSR
// always reports the transmitter empty. Input from the host is queued with
// enqueue_input() into a bounded receive FIFO.
//
// The interrupt is modelled as a level: the line is high while any enabled
// condition is pending (data available, THR empty, line status, modem
// status), as on the real chip; the machine's IrqLine turns the rising edge
// into an interrupt for an edge-triggered IOAPIC/PIC entry. OUT2 does not
// gate the line (as in QEMU), so a minimal guest need not set it.
//
// Threading: register accesses arrive on vCPU threads, enqueue_input() on
// the host's thread; one mutex serialises them. The output sink and the
// IrqLine are called with that mutex held (so bytes keep their order): they
// must not call back into this device and should not block for long.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include "devices/device.h"

namespace torpor {

class Serial8250 : public BusDevice {
 public:
  using OutputSink = std::function<void(const uint8_t*, size_t)>;

  // Bytes the receive FIFO holds; input beyond it is refused (not dropped
  // silently: enqueue_input returns how much it took).
  static constexpr size_t kRxCapacity = 4096;
  static constexpr uint64_t kRangeLen = 8;

  Serial8250(IrqLine& irq, OutputSink output);

  const char* name() const override { return "serial8250"; }
  void read(uint64_t offset, uint8_t* data, size_t len) override;
  void write(uint64_t offset, const uint8_t* data, size_t len) override;
  void save(StateWriter& out) const override;
  void restore(StateReader& in) override;

  // Queues host input for the guest; returns the number of bytes accepted
  // (less than len when the FIFO is full: the caller keeps the rest).
  size_t enqueue_input(const uint8_t* data, size_t len);
  // Free space in the receive FIFO.
  size_t input_space() const;

 private:
  struct Regs {
    uint8_t ier = 0;
    uint8_t lcr = 0x03;  // 8N1
    uint8_t mcr = 0x08;  // OUT2
    uint8_t scr = 0;
    uint8_t dll = 0x0c;  // 9600 baud
    uint8_t dlm = 0;
    bool fifo_enabled = false;
    bool overrun = false;      // LSR.OE, cleared by reading LSR
    uint8_t msr_delta = 0;     // MSR bits 0..3, cleared by reading MSR
    bool thre_pending = false; // THR-empty interrupt latched, cleared by IIR read / THR write
  };

  uint8_t read_reg(uint8_t reg);
  void write_reg(uint8_t reg, uint8_t value);
  uint8_t iir() const;
  uint8_t lsr() const;
  uint8_t msr_status() const;  // MSR bits 4..7
  void set_mcr(uint8_t value);
  void push_rx(uint8_t byte);
  void update_irq();

  IrqLine& irq_;
  OutputSink output_;
  mutable std::mutex mu_;
  Regs r_;
  std::deque<uint8_t> rx_;
  bool line_high_ = false;
};

}  // namespace torpor
