#include "devices/i8042/i8042.h"

#include <vector>

namespace torpor {
namespace {

// Status register.
constexpr uint8_t kStatusOutputFull = 0x01;
constexpr uint8_t kStatusSystemFlag = 0x04;
constexpr uint8_t kStatusCommand = 0x08;  // last write was to the command port
constexpr uint8_t kStatusKbdUnlocked = 0x10;

// Controller configuration byte.
constexpr uint8_t kCtrKbdInt = 0x01;
constexpr uint8_t kCtrSystemFlag = 0x04;
constexpr uint8_t kCtrKbdDisable = 0x10;
constexpr uint8_t kCtrAuxDisable = 0x20;

// Controller commands.
constexpr uint8_t kCmdReadCtr = 0x20;
constexpr uint8_t kCmdWriteCtr = 0x60;
constexpr uint8_t kCmdAuxDisable = 0xa7;
constexpr uint8_t kCmdAuxEnable = 0xa8;
constexpr uint8_t kCmdSelfTest = 0xaa;
constexpr uint8_t kCmdKbdTest = 0xab;
constexpr uint8_t kCmdKbdDisable = 0xad;
constexpr uint8_t kCmdKbdEnable = 0xae;
constexpr uint8_t kCmdReadOutputPort = 0xd0;
constexpr uint8_t kCmdWriteOutputPort = 0xd1;
constexpr uint8_t kCmdWriteKbdBuffer = 0xd2;
constexpr uint8_t kCmdPulseFirst = 0xf0;  // 0xf0-0xff: pulse output lines whose bit is 0

constexpr uint8_t kSelfTestOk = 0x55;
constexpr uint8_t kKbdTestOk = 0x00;
constexpr uint8_t kOutputPortReset = 0x01;  // active low

// Keyboard answers.
constexpr uint8_t kKbdAck = 0xfa;
constexpr uint8_t kKbdSelfTestOk = 0xaa;
constexpr uint8_t kKbdCmdEcho = 0xee;
constexpr uint8_t kKbdCmdIdentify = 0xf2;
constexpr uint8_t kKbdCmdReset = 0xff;

// More than a probe ever leaves unread; keeps a chatty guest bounded.
constexpr size_t kOutputCapacity = 16;

constexpr const char* kStateTag = "i8042";
constexpr uint32_t kStateVersion = 1;

}  // namespace

I8042::I8042(std::function<void()> on_reset, IrqLine* kbd_irq)
    : on_reset_(std::move(on_reset)), irq_(kbd_irq) {}

uint8_t I8042::status() const {
  uint8_t v = kStatusKbdUnlocked;
  if (!s_.out.empty()) v |= kStatusOutputFull;
  if (s_.ctr & kCtrSystemFlag) v |= kStatusSystemFlag;
  if (s_.last_was_command) v |= kStatusCommand;
  return v;  // input buffer never full: writes are handled at once
}

void I8042::update_irq() {
  if (!irq_) return;
  bool high = !s_.out.empty() && (s_.ctr & kCtrKbdInt);
  if (high != line_high_) {
    line_high_ = high;
    irq_->set_level(high);
  }
}

void I8042::push(uint8_t byte) {
  if (s_.out.size() < kOutputCapacity) s_.out.push_back(byte);
}

bool I8042::command(uint8_t cmd) {
  s_.pending_cmd = 0;
  switch (cmd) {
    case kCmdReadCtr:
      push(s_.ctr);
      return false;
    case kCmdWriteCtr:
    case kCmdWriteOutputPort:
    case kCmdWriteKbdBuffer:
      s_.pending_cmd = cmd;
      return false;
    case kCmdAuxDisable:
      s_.ctr |= kCtrAuxDisable;
      return false;
    case kCmdAuxEnable:
      s_.ctr &= static_cast<uint8_t>(~kCtrAuxDisable);
      return false;
    case kCmdSelfTest:
      s_.out.clear();
      push(kSelfTestOk);
      return false;
    case kCmdKbdTest:
      push(kKbdTestOk);
      return false;
    case kCmdKbdDisable:
      s_.ctr |= kCtrKbdDisable;
      return false;
    case kCmdKbdEnable:
      s_.ctr &= static_cast<uint8_t>(~kCtrKbdDisable);
      return false;
    case kCmdReadOutputPort:
      push(s_.output_port);
      return false;
    default:
      // Pulse: a 0 in bit 0 of the low nibble pulses the CPU reset line (0xfe).
      if (cmd >= kCmdPulseFirst) return (cmd & 0x01) == 0;
      return false;  // unknown commands are ignored, as by many real controllers
  }
}

void I8042::keyboard_byte(uint8_t value) {
  if (value == kKbdCmdEcho) {  // echo answers with itself, not with an ACK
    push(kKbdCmdEcho);
    return;
  }
  push(kKbdAck);
  switch (value) {
    case kKbdCmdReset:
      push(kKbdSelfTestOk);
      break;
    case kKbdCmdIdentify:
      push(0xab);  // MF2 keyboard
      push(0x83);
      break;
    default:
      break;
  }
}

bool I8042::data(uint8_t value) {
  uint8_t cmd = s_.pending_cmd;
  s_.pending_cmd = 0;
  switch (cmd) {
    case kCmdWriteCtr:
      s_.ctr = value;
      return false;
    case kCmdWriteOutputPort:
      s_.output_port = value | kOutputPortReset;
      return (value & kOutputPortReset) == 0;
    case kCmdWriteKbdBuffer:
      push(value);
      return false;
    default:
      keyboard_byte(value);
      return false;
  }
}

void I8042::read(uint64_t offset, uint8_t* out, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < len; i++) out[i] = 0xff;
  if (len == 0) return;
  if (offset == kDataOffset) {
    if (!s_.out.empty()) {
      out[0] = s_.out.front();
      s_.out.pop_front();
    } else {
      out[0] = 0;
    }
  } else if (offset == kCommandOffset) {
    out[0] = status();
  }
  update_irq();
}

void I8042::write(uint64_t offset, const uint8_t* in, size_t len) {
  if (len == 0) return;
  bool reset = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (offset == kDataOffset) {
      s_.last_was_command = false;
      reset = data(in[0]);
    } else if (offset == kCommandOffset) {
      s_.last_was_command = true;
      reset = command(in[0]);
    }
    if (reset) resets_++;
    update_irq();
  }
  // Outside the lock: the machine's handler may inspect the device (save).
  if (reset && on_reset_) on_reset_();
}

uint64_t I8042::reset_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return resets_;
}

void I8042::save(StateWriter& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  out.header(kStateTag, kStateVersion);
  out.u8(s_.ctr);
  out.u8(s_.output_port);
  out.u8(s_.pending_cmd);
  out.boolean(s_.last_was_command);
  std::vector<uint8_t> buf(s_.out.begin(), s_.out.end());
  out.bytes(buf.data(), buf.size());
}

void I8042::restore(StateReader& in) {
  in.expect_header(kStateTag, kStateVersion, kStateVersion);
  State s;
  s.ctr = in.u8();
  s.output_port = in.u8();
  s.pending_cmd = in.u8();
  s.last_was_command = in.boolean();
  std::vector<uint8_t> buf = in.bytes(kOutputCapacity);
  if (s.pending_cmd != 0 && s.pending_cmd != kCmdWriteCtr && s.pending_cmd != kCmdWriteOutputPort &&
      s.pending_cmd != kCmdWriteKbdBuffer)
    StateReader::fail("i8042: bad pending command");
  s.out.assign(buf.begin(), buf.end());

  std::lock_guard<std::mutex> lock(mu_);
  s_ = std::move(s);
  line_high_ = irq_ && !s_.out.empty() && (s_.ctr & kCtrKbdInt);
}

}  // namespace torpor
