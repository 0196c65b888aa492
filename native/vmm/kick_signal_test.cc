// The vCPU kick signal: installed once per process with a reference count,
// restored when the last reference goes, refused when someone else owns it.
#include <signal.h>

#include <cstring>

#include "common/error.h"
#include "test/check.h"
#include "vmm/kick_signal.h"

using namespace torpor;

namespace {
void foreign_handler(int) {}
sighandler_t current_handler() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sigaction(kick_signal_number(), nullptr, &sa);
  return sa.sa_handler;
}
}  // namespace

TEST("vmm kick signal: reference counted, SA_RESTART, restored after the last machine") {
  CHECK(current_handler() == SIG_DFL);
  {
    KickSignalRef a;
    sighandler_t ours = current_handler();
    CHECK(ours != SIG_DFL);
    struct sigaction sa;
    sigaction(kick_signal_number(), nullptr, &sa);
    CHECK(sa.sa_flags & SA_RESTART);
    {
      KickSignalRef b;
      CHECK(current_handler() == ours);
    }
    CHECK(current_handler() == ours);  // a still holds it
    // A kick on a thread that is not a vCPU is harmless: the handler does nothing.
    raise(kick_signal_number());
  }
  CHECK(current_handler() == SIG_DFL);
}

TEST("vmm kick signal: refuses to start when another handler owns the signal") {
  struct sigaction sa, old;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = foreign_handler;
  sigaction(kick_signal_number(), &sa, &old);
  CHECK_THROWS_CODE(KickSignalRef ref, "KVM_UNAVAILABLE");
  CHECK(current_handler() == foreign_handler);  // left alone
  sigaction(kick_signal_number(), &old, nullptr);
}
