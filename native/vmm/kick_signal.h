// The one process-wide signal that kicks vCPU threads out of KVM_RUN.
//
// A real-time signal (SIGRTMIN + kKickSignalOffset; never SIGUSR1, which
// Node's inspector owns, nor SIGPROF/SIGSEGV/SIGBUS, which V8 uses). It is
// installed when the first machine is built and restored when the last one
// goes (a reference count), with SA_RESTART, and a handler that only sets
// immediate_exit in the kvm_run of the thread it lands on. Installing
// refuses (KVM_UNAVAILABLE) when another handler already owns the signal.
#pragma once

#include <linux/kvm.h>
#include <pthread.h>

namespace torpor {

inline constexpr int kKickSignalOffset = 4;
int kick_signal_number();

// Holds one reference on the installed handler.
class KickSignalRef {
 public:
  KickSignalRef();   // throws when the signal is owned by someone else
  ~KickSignalRef();
  KickSignalRef(const KickSignalRef&) = delete;
  KickSignalRef& operator=(const KickSignalRef&) = delete;
};

// Called on a vCPU thread before its first KVM_RUN (and with nullptr when it
// stops running): tells the handler which kvm_run to flag on this thread.
void kick_register_thread(kvm_run* run);

// Sends the kick to a thread.
void kick_thread(pthread_t thread);

}  // namespace torpor
