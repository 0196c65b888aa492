// An exclusive flock(2) on a lock file, held through an fd this process owns.
//
// flock is per open file description: two opens of the same path exclude each
// other even inside one process, and the kernel drops the lock when the fd
// closes or the process dies (SIGKILL included), so a dead owner never leaves
// a stale lock. The fd is O_CLOEXEC: a child the owner spawns does not inherit
// (and so does not prolong) the lock. The owner's pid is written into the file
// after the lock is taken, for "owned by pid N" messages only: the lock, not
// the pid, is what excludes. The file is never unlinked (unlinking a locked
// path lets two processes lock two different inodes).
#pragma once

#include <optional>
#include <string>

#include "base/fd.h"

namespace torpor {

struct FileLockAttempt {
  Fd fd;                       // valid: the lock is held until it closes
  std::optional<long> owner;   // not held: the pid in the file, when it reads as one
};

// Never blocks. Throws Error (PERMISSION_DENIED, IO_ERROR) with errno when the
// file cannot be opened or locked for another reason than contention.
FileLockAttempt try_lock_file(const std::string& path);

// The pid written in a lock file (decimal, newline-terminated), if it reads as one.
std::optional<long> read_lock_owner(int fd);

}  // namespace torpor
