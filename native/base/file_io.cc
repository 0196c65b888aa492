#include "base/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <string>

namespace torpor::file_io {

long long pread_upto(int fd, void* buf, size_t len, uint64_t off) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd, p + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return static_cast<long long>(done);
}

int pread_all(int fd, void* buf, size_t len, uint64_t off) {
  long long n = pread_upto(fd, buf, len, off);
  if (n < 0) return static_cast<int>(n);
  return static_cast<size_t>(n) == len ? 0 : -EIO;
}

int pwrite_all(int fd, const void* buf, size_t len, uint64_t off) {
  const auto* p = static_cast<const uint8_t*>(buf);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pwrite(fd, p + done, len - done, static_cast<off_t>(off + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO;
    done += static_cast<size_t>(n);
  }
  return 0;
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

int fsync_parent_dir(const char* path) {
  const std::string dir = parent_dir(path);
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int rc = ::fsync(fd) == 0 ? 0 : -errno;
  ::close(fd);
  return rc;
}

}  // namespace torpor::file_io
