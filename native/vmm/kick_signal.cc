#include "vmm/kick_signal.h"

#include <signal.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "common/error.h"

namespace torpor {

namespace {

// Does nothing, on purpose: the signal's only job is to make a KVM_RUN in
// progress return (EINTR). The sender sets immediate_exit in the vCPU's
// kvm_run before it sends the kick (Vcpu::send), which covers a thread about
// to enter KVM_RUN. The handler used to set immediate_exit itself through a
// thread_local pointer; in a dlopen'd addon a thread_local is reached through
// __tls_get_addr, which mallocs on a thread's first access. A kick landing on
// a vCPU thread inside that first malloc re-entered malloc from the handler
// and deadlocked on the arena lock, and with it every thread of the process
// that malloc'd next, the JS thread included (a sandbox restored paused and
// resumed at once hung the process, ~1 restore in 20 under load).
void on_kick(int) {}

std::mutex g_mu;
int g_refs = 0;
struct sigaction g_previous;

}  // namespace

int kick_signal_number() { return SIGRTMIN + kKickSignalOffset; }

KickSignalRef::KickSignalRef() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_refs++ > 0) return;
  int sig = kick_signal_number();
  struct sigaction current;
  std::memset(&current, 0, sizeof(current));
  sigaction(sig, nullptr, &current);
  bool is_default = !(current.sa_flags & SA_SIGINFO) && (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN);
  if (!is_default && current.sa_handler != on_kick) {
    g_refs--;
    throw Error(code::kKvmUnavailable, "signal SIGRTMIN+" + std::to_string(kKickSignalOffset) +
                                           " (used to kick vCPUs) already has a handler installed by someone else");
  }
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_kick;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(sig, &sa, &g_previous) < 0) {
    g_refs--;
    throw_sys_error(code::kInternal, "sigaction (vCPU kick signal)");
  }
}

KickSignalRef::~KickSignalRef() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (--g_refs > 0) return;
  sigaction(kick_signal_number(), &g_previous, nullptr);
}

void kick_accept_on_this_thread() {
  // The signal must reach this thread even if the creator had it blocked.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, kick_signal_number());
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

void kick_thread(pthread_t thread) { pthread_kill(thread, kick_signal_number()); }

}  // namespace torpor
