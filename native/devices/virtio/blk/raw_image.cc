#include "devices/virtio/blk/raw_image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/file_io.h"
#include "common/error.h"

namespace torpor {

RawImage::RawImage(const std::string& path, uint64_t size) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_sys_error(code::kIo, "open disk image " + path);
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int e = errno;
    ::close(fd_);
    throw_sys_error(code::kIo, "stat disk image " + path, e);
  }
  // A directory opens read-only and reads as EISDIR; anything but a file or a block device
  // (a FIFO, a socket, a character device such as /dev/zero) has no fixed size to serve.
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw Error(code::kInvalidArgument, "disk image " + path + (S_ISDIR(st.st_mode) ? " is a directory" : " is not a regular file"));
  }
  file_size_ = static_cast<uint64_t>(st.st_size);
  size_ = size ? size : (file_size_ + 511) / 512 * 512;
}

RawImage::~RawImage() {
  if (fd_ >= 0) ::close(fd_);
}

int RawImage::read(uint64_t offset, void* dst, size_t len) {
  if (!disk_range_ok(size_, offset, len)) return -EINVAL;
  auto* out = static_cast<uint8_t*>(dst);
  size_t from_file = offset < file_size_ ? static_cast<size_t>(std::min<uint64_t>(len, file_size_ - offset)) : 0;
  if (from_file) {
    long long n = file_io::pread_upto(fd_, out, from_file, offset);
    if (n < 0) return static_cast<int>(n);
    // The file shrank under us: what is gone reads as zeros, like the tail.
    from_file = static_cast<size_t>(n);
  }
  std::memset(out + from_file, 0, len - from_file);
  return 0;
}

int RawImage::write(uint64_t, const void*, size_t) { return -EROFS; }

}  // namespace torpor
