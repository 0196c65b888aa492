#include "base/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "base/fd.h"
#include "common/error.h"

namespace torpor {

namespace {

[[noreturn]] void fail(const char* what, const std::string& path, int err) {
  const bool denied = err == EACCES || err == EPERM || err == EROFS;
  throw_sys_error(denied ? code::kPermissionDenied : code::kIo, std::string("cannot ") + what + " " + path, err);
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void write_all(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write", path, n < 0 ? errno : EIO);
    data.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

void replace_file_durably(const std::string& tmp, const std::string& path, std::string_view data) {
  precondition(parent_dir(tmp) == parent_dir(path), "replace_file_durably: tmp beside path");
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0666));
    if (!fd.valid()) fail("create", tmp, errno);
    try {
      write_all(fd.get(), data, tmp);
      if (::fsync(fd.get()) != 0) fail("sync", tmp, errno);
      // close(2) can report a write-back error on some filesystems: the data would not be safe
      if (::close(fd.release()) != 0) fail("close", tmp, errno);
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail("rename into", path, err);
  }
  const std::string dir = parent_dir(path);
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd.valid()) fail("open directory", dir, errno);
  if (::fsync(dfd.get()) != 0) fail("sync directory", dir, errno);
}

}  // namespace torpor
