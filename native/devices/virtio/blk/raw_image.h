// A read-only raw disk image: the template's base layer.
//
// Opened O_RDONLY, so no code path can write it. The disk may be larger than
// the file (a sandbox disk grown beyond its template): bytes past the file's
// end read as zeros.
#pragma once

#include <string>

#include "devices/virtio/blk/disk.h"

namespace torpor {

class RawImage final : public Disk {
 public:
  // size 0: the file's size rounded up to a whole 512-byte sector.
  // Throws Error(IO_ERROR) when the file cannot be opened.
  explicit RawImage(const std::string& path, uint64_t size = 0);
  ~RawImage() override;
  RawImage(const RawImage&) = delete;
  RawImage& operator=(const RawImage&) = delete;

  uint64_t size() const override { return size_; }
  bool read_only() const override { return true; }
  int read(uint64_t offset, void* dst, size_t len) override;
  int write(uint64_t, const void*, size_t) override;
  int flush() override { return 0; }
  uint64_t file_size() const { return file_size_; }

 private:
  int fd_ = -1;
  uint64_t file_size_ = 0;
  uint64_t size_ = 0;
};

}  // namespace torpor
