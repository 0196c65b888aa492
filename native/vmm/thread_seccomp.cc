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

#include <cerrno>
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

// Per thread; touched by seccomp_enter() (before the filter) so the handler
// never triggers the lazy allocation of dynamic TLS.
struct ThreadTrap {
  bool armed = false;
  int notify_fd = -1;
  volatile sig_atomic_t violation = -1;
};
thread_local ThreadTrap tls_trap;

// siginfo si_code of a seccomp SIGSYS (SYS_SECCOMP, which not every libc header names).
constexpr int kSiCodeSeccomp = 1;

struct sigaction g_previous_sigsys;
std::once_flag g_handler_once;

void on_sigsys(int sig, siginfo_t* info, void* context) {
  ThreadTrap* t = &tls_trap;
  if (info->si_code != kSiCodeSeccomp || !t->armed) {
    // Not one of our filters: what would have happened without us.
    if (g_previous_sigsys.sa_flags & SA_SIGINFO) {
      if (g_previous_sigsys.sa_sigaction) g_previous_sigsys.sa_sigaction(sig, info, context);
      return;
    }
    if (g_previous_sigsys.sa_handler == SIG_IGN) return;
    if (g_previous_sigsys.sa_handler != SIG_DFL) {
      g_previous_sigsys.sa_handler(sig);
      return;
    }
    signal(SIGSYS, SIG_DFL);
    raise(SIGSYS);
    return;
  }
  if (t->violation < 0) t->violation = info->si_syscall;
  // The call was skipped: it returns -EPERM to its caller, which handles a
  // failed system call as it would any other.
  auto* uc = static_cast<ucontext_t*>(context);
  uc->uc_mcontext.gregs[REG_RAX] = -EPERM;
  if (t->notify_fd >= 0) {
    uint64_t one = 1;
    int saved = errno;
    ssize_t n = ::write(t->notify_fd, &one, sizeof(one));
    (void)n;
    errno = saved;
  }
}

void install_handler() {
  std::call_once(g_handler_once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSYS, &sa, &g_previous_sigsys);
  });
}

}  // namespace

bool seccomp_wanted() {
  const char* v = std::getenv("TORPOR_SECCOMP");
  return !(v && (std::strcmp(v, "off") == 0 || std::strcmp(v, "0") == 0));
}

void seccomp_enter_rules(const std::vector<SyscallRule>& rules, int notify_fd) {
  std::vector<sock_filter> prog = compile_seccomp_filter(rules);
  install_handler();
  tls_trap.notify_fd = notify_fd;
  tls_trap.violation = -1;
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
  tls_trap.armed = true;
}

void seccomp_enter(ThreadRole role, int notify_fd) { seccomp_enter_rules(seccomp_rules(role), notify_fd); }

int seccomp_violation() { return tls_trap.violation; }

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
