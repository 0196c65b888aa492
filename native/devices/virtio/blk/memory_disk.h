// A disk held in memory: the backend of the virtio-blk request tests, and of
// scratch disks that need no file.
#pragma once

#include <cerrno>
#include <cstring>
#include <vector>

#include "devices/virtio/blk/disk.h"

namespace torpor {

class MemoryDisk final : public Disk {
 public:
  explicit MemoryDisk(uint64_t size, bool read_only = false) : bytes_(size), read_only_(read_only) {}
  uint64_t size() const override { return bytes_.size(); }
  bool read_only() const override { return read_only_; }
  int read(uint64_t offset, void* dst, size_t len) override {
    if (!disk_range_ok(size(), offset, len)) return -EINVAL;
    std::memcpy(dst, bytes_.data() + offset, len);
    return 0;
  }
  int write(uint64_t offset, const void* src, size_t len) override {
    if (read_only_) return -EROFS;
    if (!disk_range_ok(size(), offset, len)) return -EINVAL;
    std::memcpy(bytes_.data() + offset, src, len);
    return 0;
  }
  int flush() override {
    flushes_++;
    return 0;
  }
  std::vector<uint8_t>& bytes() { return bytes_; }
  int flushes() const { return flushes_; }

 private:
  std::vector<uint8_t> bytes_;
  bool read_only_;
  int flushes_ = 0;
};

}  // namespace torpor
