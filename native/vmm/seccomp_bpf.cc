#include "vmm/seccomp_bpf.h"

#include <linux/audit.h>
#include <linux/seccomp.h>

#include <cerrno>
#include <cstddef>
#include <string>

#include "common/error.h"

namespace torpor {

namespace {

constexpr uint32_t kX32SyscallBit = 0x40000000;
constexpr uint32_t kNrOffset = offsetof(seccomp_data, nr);
constexpr uint32_t kArchOffset = offsetof(seccomp_data, arch);

uint32_t arg_low_offset(unsigned arg) {
  // Little endian: the low half of args[i] comes first.
  return static_cast<uint32_t>(offsetof(seccomp_data, args) + arg * sizeof(uint64_t));
}

sock_filter stmt(uint16_t code, uint32_t k) { return BPF_STMT(code, k); }
sock_filter jump(uint16_t code, uint32_t k, uint8_t jt, uint8_t jf) { return BPF_JUMP(code, k, jt, jf); }

// The instructions that follow a rule's "nr matched" test: each ends in a return.
std::vector<sock_filter> rule_body(const SyscallRule& r) {
  std::vector<sock_filter> body;
  switch (r.check) {
    case SyscallRule::Check::Any:
      body.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
      break;
    case SyscallRule::Check::OneOf: {
      if (r.values.empty() || r.values.size() > 250)
        throw Error(code::kInternal, "seccomp rule for syscall " + std::to_string(r.nr) + ": 1 to 250 values");
      body.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, arg_low_offset(r.arg)));
      size_t n = r.values.size();
      // values[i] matched -> jump over the rest and the TRAP to the ALLOW.
      for (size_t i = 0; i < n; i++)
        body.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, r.values[i], static_cast<uint8_t>(n - i), 0));
      body.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_TRAP));
      body.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
      break;
    }
    case SyscallRule::Check::Refuse:
      body.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)));
      break;
    case SyscallRule::Check::MaskClear:
      body.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, arg_low_offset(r.arg)));
      body.push_back(jump(BPF_JMP | BPF_JSET | BPF_K, r.mask, 0, 1));
      body.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_TRAP));
      body.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
      break;
  }
  return body;
}

}  // namespace

std::vector<sock_filter> compile_seccomp_filter(const std::vector<SyscallRule>& rules) {
  std::vector<sock_filter> prog;
  prog.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kArchOffset));
  prog.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0));
  prog.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_TRAP));
  prog.push_back(stmt(BPF_LD | BPF_W | BPF_ABS, kNrOffset));
  prog.push_back(jump(BPF_JMP | BPF_JGE | BPF_K, kX32SyscallBit, 0, 1));
  prog.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_TRAP));
  for (const auto& r : rules) {
    auto body = rule_body(r);
    if (body.size() > 255) throw Error(code::kInternal, "seccomp rule too long");
    prog.push_back(jump(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(r.nr), 0, static_cast<uint8_t>(body.size())));
    // The body may load an argument into A; every path through it returns,
    // so the next rule's test still sees nr (A is only changed on the match path).
    prog.insert(prog.end(), body.begin(), body.end());
  }
  prog.push_back(stmt(BPF_RET | BPF_K, SECCOMP_RET_TRAP));
  if (prog.size() > BPF_MAXINSNS) throw Error(code::kInternal, "seccomp filter over BPF_MAXINSNS instructions");
  return prog;
}

}  // namespace torpor
