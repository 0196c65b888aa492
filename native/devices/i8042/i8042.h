// The PC keyboard controller (i8042), emulated just far enough for a guest
// to probe it and to reset the machine through it.
//
// Mapping: ONE device, mapped by the machine as ONE 5-byte range of I/O
// ports at 0x60 (kBase, kRangeLen): offset 0 is the data port (0x60),
// offset 4 the status (read) / command (write) port (0x64). Offsets 1..3
// (0x61-0x63) read 0xff and ignore writes; on KVM port 0x61 (the PC speaker
// / PIT gate) is claimed by the in-kernel PIT before it reaches the bus.
//
// Guest-visible behaviour: controller self test (0xAA -> 0x55), keyboard
// interface test (0xAB -> 0x00), controller configuration byte read/write
// (0x20 / 0x60), keyboard and aux enable/disable, output port read/write
// (0xD0 / 0xD1; clearing bit 0 resets), write to the keyboard output buffer
// (0xD2), and pulse of the output lines (0xF0-0xFF; 0xFE pulses the reset
// line). Bytes written to the data port without a pending controller
// command go to the "keyboard", which acknowledges them (0xFA) and answers
// reset (0xFF) and identify (0xF2). There is no aux (mouse) port: Linux is
// booted with `i8042.noaux i8042.nomux i8042.dumbkbd`.
//
// A reset request calls on_reset() on the vCPU thread that made it, with the
// device's lock released; the callback must only ask the machine to stop
// (post a message), never tear the bus down from inside the access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

#include "devices/device.h"

namespace torpor {

class I8042 : public BusDevice {
 public:
  static constexpr uint64_t kBase = 0x60;
  static constexpr uint64_t kRangeLen = 5;
  static constexpr uint64_t kDataOffset = 0;
  static constexpr uint64_t kCommandOffset = 4;

  // kbd_irq (optional, IRQ 1): raised when the output buffer holds a byte
  // and the configuration byte enables keyboard interrupts.
  explicit I8042(std::function<void()> on_reset, IrqLine* kbd_irq = nullptr);

  const char* name() const override { return "i8042"; }
  void read(uint64_t offset, uint8_t* data, size_t len) override;
  void write(uint64_t offset, const uint8_t* data, size_t len) override;
  void save(StateWriter& out) const override;
  void restore(StateReader& in) override;

  // How many resets the guest asked for (tests, diagnostics).
  uint64_t reset_requests() const;

 private:
  struct State {
    uint8_t ctr = 0x45;          // config byte: kbd interrupt, system flag, translate
    uint8_t output_port = 0x03;  // bit 0: reset line released; bit 1: A20 enabled
    uint8_t pending_cmd = 0;     // controller command waiting for its data byte, or 0
    bool last_was_command = false;  // status bit 3: last write went to port 0x64
    std::deque<uint8_t> out;     // output buffer (head is what port 0x60 returns)
  };
  // Each returns true when the guest asked for a reset.
  bool command(uint8_t cmd);
  bool data(uint8_t value);
  void keyboard_byte(uint8_t value);
  void push(uint8_t byte);
  uint8_t status() const;
  void update_irq();

  std::function<void()> on_reset_;
  IrqLine* irq_;
  mutable std::mutex mu_;
  State s_;
  bool line_high_ = false;
  uint64_t resets_ = 0;
};

}  // namespace torpor
