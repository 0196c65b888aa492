#include "base/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "common/error.h"

namespace torpor {

namespace {

[[noreturn]] void throw_lock_error(const char* what, const std::string& path, int err) {
  throw_file_error(std::string("cannot ") + what + " lock file " + path, err);
}

// Written then truncated to its length, so a reader never sees an empty file
// between the two (at worst the new digits followed by the old tail, after a newline).
void write_owner(int fd) {
  char text[24];
  int n = std::snprintf(text, sizeof text, "%ld\n", static_cast<long>(::getpid()));
  if (n <= 0) return;
  // For messages only: a lock whose pid could not be written still excludes.
  if (::pwrite(fd, text, static_cast<size_t>(n), 0) == n) (void)::ftruncate(fd, n);
}

}  // namespace

std::optional<long> read_lock_owner(int fd) {
  char text[24];
  ssize_t n = ::pread(fd, text, sizeof text, 0);
  if (n <= 0) return std::nullopt;
  long pid = 0;
  ssize_t i = 0;
  for (; i < n && text[i] >= '0' && text[i] <= '9'; i++) {
    pid = pid * 10 + (text[i] - '0');
    if (pid > 0x3fffffff) return std::nullopt;  // beyond any pid_max
  }
  if (i == 0 || i == n || text[i] != '\n' || pid <= 0) return std::nullopt;
  return pid;
}

FileLockAttempt try_lock_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY, 0644));
  // A lock file owned by another user can still be locked read-only (its pid left as is).
  if (!fd.valid() && errno == EACCES) fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) throw_lock_error("open", path, errno);
  for (;;) {
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) break;
    if (errno == EINTR) continue;
    if (errno == EWOULDBLOCK) return FileLockAttempt{Fd(), read_lock_owner(fd.get())};
    throw_lock_error("take", path, errno);
  }
  write_owner(fd.get());
  return FileLockAttempt{std::move(fd), std::nullopt};
}

}  // namespace torpor
