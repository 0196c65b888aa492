#include "vmm/thread_seccomp.h"

#include <linux/kvm.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "common/error.h"

namespace torpor {

namespace {

using Check = SyscallRule::Check;

SyscallRule any(int nr) { return SyscallRule{nr}; }
SyscallRule one_of(int nr, unsigned arg, std::vector<uint32_t> values) {
  SyscallRule r{nr, Check::OneOf, arg};
  r.values = std::move(values);
  return r;
}
SyscallRule refuse(int nr) { return SyscallRule{nr, Check::Refuse}; }
SyscallRule mask_clear(int nr, unsigned arg, uint32_t mask) {
  SyscallRule r{nr, Check::MaskClear, arg};
  r.mask = mask;
  return r;
}

// What every thread that touches guest data needs from the C/C++ runtime and
// from the machine's plumbing. Found by tracing the test suite (strace -f,
// docs/seccomp.md): nothing here opens, creates, maps executable memory,
// spawns, or reaches the network.
void add_runtime_rules(std::vector<SyscallRule>& rules) {
  // Locks, condition variables, thread joins.
  rules.push_back(any(SYS_futex));
  // malloc (new arenas, trimming), never executable memory.
  rules.push_back(mask_clear(SYS_mmap, 2, PROT_EXEC));
  rules.push_back(mask_clear(SYS_mprotect, 2, PROT_EXEC));
  rules.push_back(any(SYS_munmap));
  rules.push_back(any(SYS_madvise));
  rules.push_back(any(SYS_mremap));
  rules.push_back(any(SYS_brk));
  // Signals: the kick signal's handler returns, masks around waits, and the
  // kick sent to a vCPU thread (pthread_kill: tgkill on this process only).
  rules.push_back(any(SYS_rt_sigreturn));
  rules.push_back(any(SYS_rt_sigprocmask));
  rules.push_back(one_of(SYS_tgkill, 0, {static_cast<uint32_t>(::getpid())}));
  rules.push_back(any(SYS_getpid));
  rules.push_back(any(SYS_gettid));
  // Time (the vDSO's fallbacks) and waits.
  rules.push_back(any(SYS_clock_gettime));
  rules.push_back(any(SYS_clock_nanosleep));
  rules.push_back(any(SYS_nanosleep));
  rules.push_back(any(SYS_sched_yield));
  rules.push_back(any(SYS_restart_syscall));
  // Wake-ups between threads: eventfds (the I/O loop's, libuv's async
  // handle behind a thread-safe function, irqfds) and the console log.
  rules.push_back(any(SYS_write));
  rules.push_back(any(SYS_read));
  // glibc's malloc opens /sys/devices/system/cpu/online when the process
  // creates its ninth arena, which can happen on any thread: refused quietly
  // (EPERM, no violation), glibc then counts CPUs with sched_getaffinity.
  // Nothing here may open a file, so no open is ever executed.
  rules.push_back(refuse(SYS_openat));
  rules.push_back(refuse(SYS_open));
  rules.push_back(any(SYS_sched_getaffinity));
  // The end of the thread; and of the process if a fatal error ever ends
  // it from here (a trapped exit_group would leave the process hanging).
  rules.push_back(any(SYS_exit));
  rules.push_back(any(SYS_exit_group));
}

// ioctls on the VM fd a device may make from either thread: level interrupts
// (serial, and virtio lines without an irqfd).
std::vector<uint32_t> vm_ioctls() { return {static_cast<uint32_t>(KVM_IRQ_LINE)}; }

// What the devices do. Their register handlers run on the vCPU thread that
// took the exit (a driver's reset drops vsock connections, activation serves
// the queues) and their queue work on the I/O thread, so both threads get the
// same list: work on fds opened when the machine was built or handed over by
// the JS thread, never an open, a socket other than an AF_UNIX pair, a
// connect or a listen.
void add_device_rules(std::vector<SyscallRule>& rules) {
  rules.push_back(any(SYS_epoll_ctl));
  // Block requests against the disk files opened at build time.
  rules.push_back(any(SYS_pread64));
  rules.push_back(any(SYS_pwrite64));
  rules.push_back(any(SYS_preadv));
  rules.push_back(any(SYS_pwritev));
  rules.push_back(any(SYS_fdatasync));
  rules.push_back(any(SYS_fsync));
  rules.push_back(any(SYS_fallocate));
  rules.push_back(any(SYS_lseek));
  // vsock: the host ends of connections, each an AF_UNIX socketpair (made
  // by the device when the guest answers a connect), and its timer.
  // virtio-net: the stream backend's recv/send on its end of the socketpair
  // to passt (made on the JS thread, which also spawns passt).
  rules.push_back(one_of(SYS_socketpair, 0, {AF_UNIX}));
  rules.push_back(any(SYS_recvfrom));
  rules.push_back(any(SYS_sendto));
  rules.push_back(any(SYS_recvmsg));
  rules.push_back(any(SYS_sendmsg));
  rules.push_back(any(SYS_readv));
  rules.push_back(any(SYS_writev));
  rules.push_back(any(SYS_shutdown));
  rules.push_back(any(SYS_poll));
  rules.push_back(any(SYS_close));
  rules.push_back(any(SYS_timerfd_settime));
  rules.push_back(any(SYS_timerfd_gettime));
  // virtio-rng.
  rules.push_back(any(SYS_getrandom));
}

}  // namespace

std::vector<SyscallRule> seccomp_rules(ThreadRole role) {
  std::vector<SyscallRule> rules;
  if (role == ThreadRole::Vcpu) {
    // First: KVM_RUN is the one hot call, made at every exit (the second
    // comparison of the program after the architecture checks).
    std::vector<uint32_t> ioctls = {static_cast<uint32_t>(KVM_RUN)};
    for (uint32_t r : vm_ioctls()) ioctls.push_back(r);
    rules.push_back(one_of(SYS_ioctl, 1, ioctls));
    add_runtime_rules(rules);
    add_device_rules(rules);
  } else {
    rules.push_back(any(SYS_epoll_wait));
    rules.push_back(any(SYS_epoll_pwait));
    add_runtime_rules(rules);
    add_device_rules(rules);
    rules.push_back(one_of(SYS_ioctl, 1, vm_ioctls()));
  }
  return rules;
}

namespace {

// Per filtered thread, in a fixed table the SIGSYS handler searches by the
// thread pointer (%fs base: a register read, no call). The handler touches
// no thread_local: in a dlopen'd addon the first access to one goes through
// __tls_get_addr, which may malloc, and a signal landing inside malloc would
// deadlock on the arena lock (the same hazard that hung the vCPU kick,
// docs/vmm.md). A thread takes a slot before its filter is installed and
// gives it back when it ends.
struct ThreadTrap {
  std::atomic<uintptr_t> owner{0};  // the thread pointer; 0 = free
  std::atomic<bool> armed{false};   // its filter is installed (a trap is ours)
  std::atomic<int> notify_fd{-1};
  std::atomic<int> violation{-1};
};
constexpr size_t kTrapSlots = 4096;  // filtered threads alive at once (vCPUs + I/O threads)
ThreadTrap g_traps[kTrapSlots];

uintptr_t self_id() { return reinterpret_cast<uintptr_t>(__builtin_thread_pointer()); }
size_t slot_hash(uintptr_t id) { return (id >> 12) * 0x9E3779B97F4A7C15ull % kTrapSlots; }

// Async-signal-safe: atomic loads only.
ThreadTrap* find_trap(uintptr_t id) {
  for (size_t i = 0, at = slot_hash(id); i < kTrapSlots; i++, at = (at + 1) % kTrapSlots)
    if (g_traps[at].owner.load(std::memory_order_acquire) == id) return &g_traps[at];
  return nullptr;
}

// This thread's slot, claimed once (before its filter); released at thread exit.
struct TrapClaim {
  ThreadTrap* trap = nullptr;
  ~TrapClaim() {
    if (!trap) return;
    trap->armed.store(false);
    trap->notify_fd.store(-1);
    trap->violation.store(-1);
    trap->owner.store(0, std::memory_order_release);
  }
};
thread_local TrapClaim tls_claim;  // never read by the handler

ThreadTrap& claim_trap() {
  if (tls_claim.trap) return *tls_claim.trap;
  const uintptr_t id = self_id();
  for (size_t i = 0, at = slot_hash(id); i < kTrapSlots; i++, at = (at + 1) % kTrapSlots) {
    uintptr_t free = 0;
    if (g_traps[at].owner.compare_exchange_strong(free, id, std::memory_order_acq_rel)) {
      tls_claim.trap = &g_traps[at];
      return g_traps[at];
    }
  }
  throw Error(code::kInternal, "seccomp: more than 4096 filtered threads at once");
}

// siginfo si_code of a seccomp SIGSYS (SYS_SECCOMP, which not every libc header names).
constexpr int kSiCodeSeccomp = 1;

// The SIGSYS disposition that was in place before ours, for a SIGSYS that is
// not one of our traps. Ours can be replaced behind our back: a Node listener
// for SIGSYS (signal-exit, loaded by many npm packages, listens to it) makes
// libuv install its own handler, and libuv sets SIG_DFL when the last listener
// goes. A trap then killed the whole process (found in CI: verdaccio's
// lockfile loads signal-exit). So every filtered thread takes the handler
// back before it installs its filter (take_sigsys_handler), keeping what it
// displaced as the one to chain to. Two slots and an index: the handler reads
// the slot the index names while a later take writes the other.
struct sigaction g_previous_sigsys[2];
std::atomic<int> g_previous_at{0};
std::mutex g_handler_mu;

void on_sigsys(int sig, siginfo_t* info, void* context);

void chain_previous(int sig, siginfo_t* info, void* context) {
  const struct sigaction& prev = g_previous_sigsys[g_previous_at.load(std::memory_order_acquire)];
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction && prev.sa_sigaction != on_sigsys) prev.sa_sigaction(sig, info, context);
    return;
  }
  if (prev.sa_handler == SIG_IGN) return;
  if (prev.sa_handler != SIG_DFL) {
    prev.sa_handler(sig);
    return;
  }
  signal(SIGSYS, SIG_DFL);
  raise(SIGSYS);
}

void on_sigsys(int sig, siginfo_t* info, void* context) {
  ThreadTrap* t = info->si_code == kSiCodeSeccomp ? find_trap(self_id()) : nullptr;
  if (!t || !t->armed.load()) {
    // Not one of our filters: what would have happened without us.
    chain_previous(sig, info, context);
    return;
  }
  int none = -1;
  t->violation.compare_exchange_strong(none, info->si_syscall);
  // The call was skipped: it returns -EPERM to its caller, which handles a
  // failed system call as it would any other.
  auto* uc = static_cast<ucontext_t*>(context);
  uc->uc_mcontext.gregs[REG_RAX] = -EPERM;
  if (int fd = t->notify_fd.load(); fd >= 0) {
    uint64_t one = 1;
    int saved = errno;
    ssize_t n = ::write(fd, &one, sizeof(one));
    (void)n;
    errno = saved;
  }
}

}  // namespace

bool sigsys_handler_is_ours() {
  struct sigaction current;
  if (sigaction(SIGSYS, nullptr, &current) != 0) return false;
  return (current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigsys;
}

void take_sigsys_handler() {
  std::lock_guard<std::mutex> lock(g_handler_mu);
  struct sigaction current;
  if (sigaction(SIGSYS, nullptr, &current) != 0) return;
  if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == on_sigsys) return;
  const int next = 1 - g_previous_at.load(std::memory_order_relaxed);
  g_previous_sigsys[next] = current;
  g_previous_at.store(next, std::memory_order_release);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = on_sigsys;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSYS, &sa, nullptr);
}

bool seccomp_wanted() {
  const char* v = std::getenv("TORPOR_SECCOMP");
  return !(v && (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0));
}

void seccomp_enter_rules(const std::vector<SyscallRule>& rules, int notify_fd) {
  std::vector<sock_filter> prog = compile_seccomp_filter(rules);
  take_sigsys_handler();
  // The slot before the filter: a trap from here on finds it.
  ThreadTrap& trap = claim_trap();
  trap.notify_fd.store(notify_fd);
  trap.violation.store(-1);
  // SIGSYS must reach this thread even if its creator had it blocked.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGSYS);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  // Per thread: only this thread's future execve is affected (we make none).
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) throw_sys_error(code::kInternal, "prctl(PR_SET_NO_NEW_PRIVS)");
  sock_fprog fprog{};
  fprog.len = static_cast<unsigned short>(prog.size());
  fprog.filter = prog.data();
  // seccomp(2) without SECCOMP_FILTER_FLAG_TSYNC: this thread only.
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0)
    throw_sys_error(code::kInternal, "seccomp(SECCOMP_SET_MODE_FILTER)");
  trap.armed.store(true);
}

void seccomp_enter(ThreadRole role, int notify_fd) { seccomp_enter_rules(seccomp_rules(role), notify_fd); }

int seccomp_violation() { return tls_claim.trap ? tls_claim.trap->violation.load() : -1; }

std::string seccomp_describe(int nr) {
  std::string s = "system call " + std::to_string(nr);
  switch (nr) {
    case SYS_uname: return s + " (uname)";
    case SYS_openat: return s + " (openat)";
    case SYS_open: return s + " (open)";
    case SYS_socket: return s + " (socket)";
    case SYS_connect: return s + " (connect)";
    case SYS_execve: return s + " (execve)";
    case SYS_clone: return s + " (clone)";
    case SYS_clone3: return s + " (clone3)";
    case SYS_ioctl: return s + " (ioctl)";
    case SYS_mmap: return s + " (mmap)";
    case SYS_mprotect: return s + " (mprotect)";
    default: return s;
  }
}

void seccomp_make_forbidden_call() {
  struct utsname u;
  ::syscall(SYS_uname, &u);
}

}  // namespace torpor
