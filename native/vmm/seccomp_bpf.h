// A seccomp allow-list compiled to a classic BPF program (x86_64).
//
// The program checks the architecture, refuses x32 system call numbers, then
// walks the rules in order (put the hot ones first: KVM_RUN's ioctl is
// matched by the second comparison of a vCPU's filter). A system call with no
// rule, or whose rule's argument check fails, gets SECCOMP_RET_TRAP: the
// kernel skips it and sends SIGSYS to the calling thread (thread_seccomp.h
// turns that into a failed machine). Argument checks look at the low 32 bits
// of one argument, which is all the kernel reads of an ioctl request, a
// signal number, a protection mask or a thread group id.
#pragma once

#include <linux/filter.h>

#include <cstdint>
#include <vector>

namespace torpor {

struct SyscallRule {
  enum class Check {
    Any,        // allowed whatever the arguments
    OneOf,      // args[arg] (low 32 bits) is one of `values`
    MaskClear,  // args[arg] & mask == 0 (e.g. no PROT_EXEC in mmap's prot)
    Refuse,     // not executed, fails with EPERM, no SIGSYS (a call the C library
                // makes on its own and copes without: see thread_seccomp.cc)
  };
  int nr;
  Check check = Check::Any;
  unsigned arg = 0;
  std::vector<uint32_t> values;  // OneOf
  uint32_t mask = 0;             // MaskClear
};

// The BPF program for `rules`; throws INTERNAL when a rule cannot be encoded
// (more than 250 values in one rule: a classic BPF jump reaches 255 ahead).
std::vector<sock_filter> compile_seccomp_filter(const std::vector<SyscallRule>& rules);

}  // namespace torpor
