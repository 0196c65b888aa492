// Closes a released machine's KVM objects off the caller's thread.
//
// Closing the last fd of a VM makes the kernel tear it down there and then:
// measured on PVM, ~15 ms for a 32 MiB, 1-vCPU guest. Machine::release()
// runs on the JS thread, so it hands the vCPU fds, the guest RAM mappings
// and the VM fd to one process-wide thread instead. Back-pressure keeps the
// promise of release(): with kMaxPending closures waiting, the caller runs
// its own inline, so a loop that stops machines faster than the kernel
// destroys them cannot pile up fds or memory.
#pragma once

#include <cstddef>
#include <functional>

namespace torpor {

inline constexpr size_t kReaperMaxPending = 4;

// Runs fn on the reaper thread soon, or inline (queue full, or no thread
// could be started). fn must not throw and must not touch the machine.
void reap_later(std::function<void()> fn);
// Waits until everything handed over so far has run (tests, process exit).
void reap_drain();

}  // namespace torpor
