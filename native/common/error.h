// Errors inside the native core.
//
// Native code reports failures by throwing torpor::Error (never anything else
// on purpose). The N-API layer (native/addon) catches it at every entry point
// and turns it into a JS TorporError with the same stable `code` and `errno`.
// No code path in the addon may call abort(), exit() or let an exception
// escape into N-API.
#pragma once

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace torpor {

// Stable codes shared with lib/errors.ts. Keep both lists in sync.
namespace code {
inline constexpr const char* kKvmUnavailable = "KVM_UNAVAILABLE";
inline constexpr const char* kInvalidArgument = "INVALID_ARGUMENT";
inline constexpr const char* kIo = "IO_ERROR";
inline constexpr const char* kPermissionDenied = "PERMISSION_DENIED";
inline constexpr const char* kOutOfSpace = "OUT_OF_SPACE";  // the host's disk (or quota) is full
inline constexpr const char* kGuestMemory = "GUEST_MEMORY";      // guest gave a bad address
inline constexpr const char* kBootFailed = "BOOT_FAILED";        // kernel/initrd could not be loaded
inline constexpr const char* kMachineFailed = "MACHINE_FAILED";  // triple fault, internal error...
inline constexpr const char* kInvalidState = "INVALID_STATE";    // e.g. pause of a stopped machine
inline constexpr const char* kSnapshotInvalid = "SNAPSHOT_INVALID";          // corrupt, truncated, wrong version
inline constexpr const char* kSnapshotIncompatible = "SNAPSHOT_INCOMPATIBLE";  // taken on another host kind or CPU
inline constexpr const char* kVsockRefused = "VSOCK_REFUSED";
inline constexpr const char* kTimeout = "TIMEOUT";
inline constexpr const char* kNetBackend = "NET_BACKEND";  // the user-mode network stack failed or is missing
inline constexpr const char* kInternal = "INTERNAL";
}  // namespace code

class Error : public std::runtime_error {
  static bool out_of_space(const char* code, int err) {
    return (err == ENOSPC || err == EDQUOT) && std::strcmp(code, code::kIo) == 0;
  }

 public:
  // An IO_ERROR whose errno is ENOSPC or EDQUOT is OUT_OF_SPACE: a full disk is
  // the one I/O failure a user can act on (free space, or TORPOR_HOME elsewhere).
  Error(const char* code, const std::string& message, int err = 0)
      : std::runtime_error(message), code_(out_of_space(code, err) ? code::kOutOfSpace : code), errno_(err) {}
  const char* code() const noexcept { return code_; }
  int sys_errno() const noexcept { return errno_; }

 private:
  const char* code_;
  int errno_;
};

// A precondition of an internal interface: what lib checks once, at the public
// edge, for the user (lib/validate.ts), the layers below only assert. A broken
// one is a bug in the caller: Error(INTERNAL) naming the condition, caught at
// the addon's entry point like every Error (never an abort).
inline void precondition(bool holds, const char* what) {
  if (!holds) throw Error(code::kInternal, std::string("precondition failed: ") + what);
}

// Throws an Error carrying the current errno, e.g. sys_error(code::kIo, "open disk").
[[noreturn]] void throw_sys_error(const char* code, const std::string& what, int err = errno);
// throw_sys_error for a file of torpor's own (a lock, meta.json): PERMISSION_DENIED
// where the kernel refused access (EACCES, EPERM, EROFS), else IO_ERROR.
[[noreturn]] void throw_file_error(const std::string& what, int err = errno);

}  // namespace torpor
