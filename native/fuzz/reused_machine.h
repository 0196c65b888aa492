// What a device fuzz target keeps from one input to the next: guest RAM and an I/O loop that
// never starts, made once per process (fuzzers never exit cleanly, so neither is freed).
// Making them per input (allocating, zeroing and faulting in megabytes of RAM, an epoll fd
// and an eventfd) cost more than the device work of most inputs.
//
// A target calls reset_reused_machine() after each input, once the input's devices are gone:
// closures the transport posted find their device dead (its guard) and do nothing, and the
// pages the input wrote are zeroed, found through GuestMemory's dirty bitmap. Every device
// write goes through GuestMemory (or marks what it wrote through a host pointer), and the
// harness writes RAM through ram.mem, never through ram.at(), so the next input sees the same
// all-zero RAM and empty loop as the first: the same input behaves the same whatever ran
// before. The standalone drivers check that after every input (a write that bypassed the
// dirty bitmap would also be lost from a diff snapshot).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "base/event_loop.h"
#include "devices/virtio/queue/mock.h"

namespace torpor::fuzz {

// One RAM per process: the first call's size holds for the process.
inline testing::FakeRam& reused_ram(uint64_t size) {
  static testing::FakeRam* ram = new testing::FakeRam(size);
  return *ram;
}

inline EventLoop& idle_loop() {
  static EventLoop* loop = new EventLoop();
  return *loop;
}

inline void reset_reused_machine(testing::FakeRam& ram) {
  idle_loop().run_pending();
  ram.zero_dirty();
#ifdef TORPOR_FUZZ_STANDALONE
  if (!ram.all_zero()) {
    std::fprintf(stderr, "fuzz: guest RAM was written without marking it dirty\n");
    std::abort();
  }
#endif
}

}  // namespace torpor::fuzz
