// The bytes of a kernel or initrd image, read where they are needed instead
// of held whole in host memory. Buffering a 20 MB vmlinux cost ~5000 first
// touches of fresh heap pages, then as many again to copy it into guest RAM
// (tens of ms on a PVM host, where a first touch costs microseconds):
// reading a segment straight into guest RAM touches each destination page once.
//
// A source is untrusted input: read() refuses any range outside it
// (BOOT_FAILED, overflow included) and a file that shrinks while being read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/fd.h"

namespace torpor::x86 {

class ImageSource {
 public:
  virtual ~ImageSource() = default;
  virtual uint64_t size() const = 0;
  // Copies [off, off + len) of the image to dst; BOOT_FAILED when the range
  // is not inside the image, IO_ERROR when the file cannot be read.
  virtual void read(uint64_t off, void* dst, size_t len) const = 0;
  // [off, off + len) lies inside the image (no overflow).
  bool contains(uint64_t off, uint64_t len) const { return off <= size() && len <= size() - off; }
};

// An image already in memory (tests, fuzzing). Keeps a reference: the bytes
// must outlive the source.
class BufferImage final : public ImageSource {
 public:
  explicit BufferImage(const std::vector<uint8_t>& bytes, const char* what = "kernel") : bytes_(bytes), what_(what) {}
  uint64_t size() const override { return bytes_.size(); }
  void read(uint64_t off, void* dst, size_t len) const override;

 private:
  const std::vector<uint8_t>& bytes_;
  const char* what_;
};

// A regular file read with pread. `what` names it in errors ("kernel",
// "initrd"); a file larger than max_bytes is refused (BOOT_FAILED).
class FileImage final : public ImageSource {
 public:
  FileImage(const std::string& path, uint64_t max_bytes, const char* what);
  uint64_t size() const override { return size_; }
  void read(uint64_t off, void* dst, size_t len) const override;

 private:
  std::string path_;
  const char* what_;
  Fd fd_;
  uint64_t size_ = 0;
};

}  // namespace torpor::x86
