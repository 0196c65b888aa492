// The one process-wide signal that kicks vCPU threads out of KVM_RUN.
//
// A real-time signal (SIGRTMIN + kKickSignalOffset; never SIGUSR1, which
// Node's inspector owns, nor SIGPROF/SIGSEGV/SIGBUS, which V8 uses). It is
// installed when the first machine is built and restored when the last one
// goes (a reference count), with SA_RESTART, and a handler that does nothing
// (the sender sets immediate_exit first; kick_signal.cc says why the handler
// must not touch thread-local storage). Installing refuses (KVM_UNAVAILABLE)
// when another handler already owns the signal.
#pragma once

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

// Called on a vCPU thread before its first KVM_RUN: unblocks the signal there.
void kick_accept_on_this_thread();

// Sends the kick to a thread.
void kick_thread(pthread_t thread);

}  // namespace torpor
