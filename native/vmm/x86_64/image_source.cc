#include "vmm/x86_64/image_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace torpor::x86 {

namespace {

[[noreturn]] void outside(const char* what, uint64_t off, uint64_t len) {
  throw Error(code::kBootFailed, std::string(what) + ": truncated (" + std::to_string(len) + " bytes at offset " +
                                     std::to_string(off) + " lie outside the file)");
}

}  // namespace

void BufferImage::read(uint64_t off, void* dst, size_t len) const {
  if (!contains(off, len)) outside(what_, off, len);
  if (len) std::memcpy(dst, bytes_.data() + off, len);
}

FileImage::FileImage(const std::string& path, uint64_t max_bytes, const char* what) : path_(path), what_(what) {
  fd_.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd_.valid()) throw_sys_error(code::kBootFailed, std::string(what) + " " + path);
  struct stat st;
  if (::fstat(fd_.get(), &st) < 0) throw_sys_error(code::kBootFailed, std::string(what) + " " + path);
  if (!S_ISREG(st.st_mode)) throw Error(code::kBootFailed, std::string(what) + " " + path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw Error(code::kBootFailed, std::string(what) + " " + path + " is larger than guest RAM allows");
  size_ = static_cast<uint64_t>(st.st_size);
}

void FileImage::read(uint64_t off, void* dst, size_t len) const {
  if (!contains(off, len)) outside(what_, off, len);
  auto* out = static_cast<uint8_t*>(dst);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::pread(fd_.get(), out + done, len - done, static_cast<off_t>(off + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_sys_error(code::kIo, std::string("read ") + what_ + " " + path_);
    if (n == 0) throw Error(code::kBootFailed, std::string(what_) + " " + path_ + " shrank while being read");
    done += static_cast<size_t>(n);
  }
}

}  // namespace torpor::x86
