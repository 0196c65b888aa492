// Per-thread seccomp: the allow-lists of the threads that touch guest data
// (a machine's vCPU threads and its I/O thread) and what happens on a call
// outside them. docs/seccomp.md explains the lists; thread_seccomp.cc holds them.
//
// A thread calls seccomp_enter() once, before it first reads guest memory or
// enters KVM_RUN. The filter (vmm/seccomp_bpf.h) applies to that thread only
// (no TSYNC) and lives as long as the thread. A forbidden call is not
// executed: the kernel raises SIGSYS on the thread, whose handler makes the
// call return -EPERM, records its number for the thread and, when the thread
// gave one, writes to a notification eventfd. The machine then fails with
// kind 'seccomp-violation'; the process and the other machines go on. The
// handler only stores to memory and writes to an fd (async-signal-safe), so
// the trap is safe to take in the middle of any code.
//
// TORPOR_SECCOMP=off in the environment (read when a machine is built)
// leaves the filters out, for debugging.
#pragma once

#include <string>
#include <vector>

#include "vmm/seccomp_bpf.h"

namespace torpor {

enum class ThreadRole { Vcpu, Io };

// The rules a thread of this role is held to (for tests and the docs).
std::vector<SyscallRule> seccomp_rules(ThreadRole role);

// Whether machines built now install filters (TORPOR_SECCOMP is not "off"/"0").
bool seccomp_wanted();

// Installs the role's filter on the calling thread. notify_fd (an eventfd, or
// -1) is written by the SIGSYS handler on a violation. Throws INTERNAL when
// the kernel refuses the filter.
void seccomp_enter(ThreadRole role, int notify_fd = -1);

// Installs an explicit rule set on the calling thread (unit tests).
void seccomp_enter_rules(const std::vector<SyscallRule>& rules, int notify_fd = -1);

// Makes the process's SIGSYS handler ours again if something replaced it (a
// Node listener for SIGSYS does: libuv installs its own, and SIG_DFL when the
// listener goes); what it displaces is chained to for a SIGSYS that is not one
// of our traps. seccomp_enter() calls it; so does each machine's start.
void take_sigsys_handler();

// Whether the process's SIGSYS handler is ours (tests).
bool sigsys_handler_is_ours();

// The system call number of this thread's first forbidden call since
// seccomp_enter(), or -1 when there was none.
int seccomp_violation();

// "system call 41 (socket)" for a violation message.
std::string seccomp_describe(int nr);

// Test hook: makes a system call that no thread's list allows (uname), to
// prove that a violation fails the machine and nothing else.
void seccomp_make_forbidden_call();

}  // namespace torpor
