// Per-thread seccomp: the filter holds the thread that installed it and no
// other, a forbidden call is skipped (EPERM), recorded and signalled on the
// thread's eventfd, and the process goes on.
#include <linux/seccomp.h>
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>

#include "test/check.h"
#include "vmm/thread_seccomp.h"

using namespace torpor;

TEST("seccomp filter: arch check first, TRAP last, every rule encoded") {
  for (auto role : {ThreadRole::Vcpu, ThreadRole::Io}) {
    auto rules = seccomp_rules(role);
    auto prog = compile_seccomp_filter(rules);
    CHECK(prog.size() > rules.size());
    CHECK(prog.size() < 512);
    CHECK_EQ(prog.back().code, static_cast<uint16_t>(BPF_RET | BPF_K));
    CHECK_EQ(prog.back().k, static_cast<uint32_t>(SECCOMP_RET_TRAP));
  }
}

namespace {
// The vCPU list, plus what the sanitizers' runtime calls on a thread (UBSan's
// memory probe, ASan's per-thread alternate signal stack and reports): this
// binary is built with them, the addon is not.
std::vector<SyscallRule> vcpu_rules_for_this_build() {
  auto rules = seccomp_rules(ThreadRole::Vcpu);
#if defined(__SANITIZE_ADDRESS__)
  for (int nr : {SYS_pipe2, SYS_close, SYS_open, SYS_openat, SYS_readlink, SYS_sigaltstack}) rules.push_back(SyscallRule{nr});
#endif
  return rules;
}
}  // namespace

TEST("seccomp: a forbidden call on a filtered thread is refused and recorded; other threads are free") {
  int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  CHECK(efd >= 0);
  int before = 0, forbidden_rc = 0, forbidden_errno = 0, after = 0, exec_map_errno = 0;
  long pid_seen = 0;
  int open_rc = 0, open_errno = 0, open_violation = 0;
  std::thread t([&] {
    seccomp_enter_rules(vcpu_rules_for_this_build(), efd);
    before = seccomp_violation();
    pid_seen = ::syscall(SYS_getpid);  // allowed
    // open is refused quietly (glibc's malloc tries one on its own): EPERM, no violation.
    open_rc = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    open_errno = errno;
    open_violation = seccomp_violation();
    struct utsname u;
    forbidden_rc = static_cast<int>(::syscall(SYS_uname, &u));
    forbidden_errno = errno;
    after = seccomp_violation();
    // Executable memory is refused too (mmap's prot is checked).
    void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    exec_map_errno = p == MAP_FAILED ? errno : 0;
    if (p != MAP_FAILED) ::munmap(p, 4096);
  });
  t.join();
  CHECK_EQ(before, -1);
  CHECK_EQ(pid_seen, static_cast<long>(::getpid()));
  CHECK_EQ(open_rc, -1);
  CHECK_EQ(open_errno, EPERM);
  CHECK_EQ(open_violation, -1);
  CHECK_EQ(forbidden_rc, -1);
  CHECK_EQ(forbidden_errno, EPERM);
  CHECK_EQ(after, static_cast<int>(SYS_uname));  // the first violation stays recorded
  CHECK_EQ(exec_map_errno, EPERM);
  uint64_t count = 0;
  CHECK_EQ(::read(efd, &count, sizeof(count)), static_cast<ssize_t>(sizeof(count)));
  CHECK(count >= 1);
  ::close(efd);
  // This thread never installed a filter.
  struct utsname u;
  CHECK_EQ(::uname(&u), 0);
  CHECK_EQ(seccomp_violation(), -1);
}

namespace {
std::atomic<int> g_foreign_sigsys{0};
void foreign_sigsys(int) { g_foreign_sigsys++; }

// A filtered thread makes the forbidden call; returns {rc, errno, recorded violation}.
std::array<int, 3> forbidden_call_on_filtered_thread() {
  std::array<int, 3> r{};
  std::thread t([&] {
    seccomp_enter_rules(vcpu_rules_for_this_build(), -1);
    struct utsname u;
    r[0] = static_cast<int>(::syscall(SYS_uname, &u));
    r[1] = errno;
    r[2] = seccomp_violation();
  });
  t.join();
  return r;
}
}  // namespace

// What a Node listener for SIGSYS does to the process (signal-exit listens to
// it; verdaccio loads it): libuv installs its own handler, plain, no
// SA_SIGINFO, and SIG_DFL when the listener goes. A trap after either used to
// kill the process.
TEST("seccomp: a SIGSYS handler installed by someone else is taken back and chained to") {
  struct sigaction foreign;
  std::memset(&foreign, 0, sizeof(foreign));
  foreign.sa_handler = foreign_sigsys;
  foreign.sa_flags = SA_RESTART;
  sigemptyset(&foreign.sa_mask);
  CHECK_EQ(sigaction(SIGSYS, &foreign, nullptr), 0);
  CHECK(!sigsys_handler_is_ours());
  auto r = forbidden_call_on_filtered_thread();
  CHECK_EQ(r[0], -1);
  CHECK_EQ(r[1], EPERM);
  CHECK_EQ(r[2], static_cast<int>(SYS_uname));
  CHECK(sigsys_handler_is_ours());
  CHECK_EQ(g_foreign_sigsys.load(), 0);  // the trap was ours, not theirs
  // A SIGSYS that is not a trap of ours still reaches the handler it displaced.
  CHECK_EQ(::raise(SIGSYS), 0);
  CHECK_EQ(g_foreign_sigsys.load(), 1);

  // libuv's "no more listeners": SIG_DFL. A trap must not kill the process.
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  CHECK_EQ(sigaction(SIGSYS, &dfl, nullptr), 0);
  r = forbidden_call_on_filtered_thread();
  CHECK_EQ(r[0], -1);
  CHECK_EQ(r[1], EPERM);
  CHECK_EQ(r[2], static_cast<int>(SYS_uname));
  CHECK(sigsys_handler_is_ours());
  // take_sigsys_handler() on an unfiltered thread (what a machine's resume calls) is idempotent.
  take_sigsys_handler();
  CHECK(sigsys_handler_is_ours());
}
