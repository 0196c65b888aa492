// What the vCPU thread's seccomp filter adds to one system call: the same
// call (ioctl(-1, KVM_RUN): the filter's hot path, then EBADF at once in the
// kernel) timed on a thread without a filter and on a thread with the vCPU
// allow-list (vmm/thread_seccomp.h), alternated, best of several rounds.
// The exit round trip (bench/seccomp.ts) is one KVM_RUN per exit, so this is
// the filter's cost per exit; on a noisy host it is below the round trip's
// own spread.
//   make -C native/bench seccomp
#include <linux/kvm.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "vmm/thread_seccomp.h"

using namespace torpor;

namespace {

double ns_per_call(bool filtered, int calls) {
  double best = 1e18;
  std::thread t([&] {
    if (filtered) seccomp_enter(ThreadRole::Vcpu);
    for (int round = 0; round < 5; round++) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; i++) ::ioctl(-1, KVM_RUN, 0);
      double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / calls;
      best = std::min(best, ns);
    }
  });
  t.join();
  return best;
}

}  // namespace

int main() {
  const int calls = 200000;
  double off = 1e18, on = 1e18;
  for (int i = 0; i < 5; i++) {
    off = std::min(off, ns_per_call(false, calls));
    on = std::min(on, ns_per_call(true, calls));
  }
  std::printf("ioctl(-1, KVM_RUN), best of 25 rounds of %d: no filter %.0f ns, vCPU filter %.0f ns, +%.0f ns per call\n",
              calls, off, on, on - off);
  return 0;
}
