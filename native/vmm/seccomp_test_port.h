// A port for tests of the seccomp filters (test/vmm-seccomp.test.ts): a guest
// write of 1 makes the writing vCPU thread make a forbidden system call, 2
// makes the I/O thread make one. The machine puts it on its port bus only when
// TORPOR_SECCOMP_TEST_HOOK is set at build time, so a machine without it pays
// nothing on its port I/O path and the port reads as nothing there.
//
// Never part of a snapshot: Machine::devices() does not list it.
#pragma once

#include <cstdint>

#include "base/event_loop.h"
#include "devices/device.h"

namespace torpor {

class SeccompTestPort final : public BusDevice {
 public:
  static constexpr uint16_t kPort = 0x5ec;
  static constexpr uint64_t kRangeLen = 1;

  // Whether this process asked for the port (TORPOR_SECCOMP_TEST_HOOK).
  static bool wanted();

  explicit SeccompTestPort(EventLoop& loop) : loop_(loop) {}

  const char* name() const override { return "seccomp-test-port"; }
  void read(uint64_t, uint8_t* data, size_t len) override;
  void write(uint64_t offset, const uint8_t* data, size_t len) override;
  void save(StateWriter&) const override {}
  void restore(StateReader&) override {}

 private:
  EventLoop& loop_;
};

}  // namespace torpor
