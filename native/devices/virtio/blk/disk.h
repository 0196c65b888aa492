// What virtio-blk reads and writes: a byte-addressed disk of fixed size.
//
// The device logic (request parsing, bounds, status codes) talks to this
// interface only, so it is unit-tested over an in-memory disk, and the disk
// layers (read-only base image, copy-on-write overlay) are tested on their
// own. Methods return 0 or -errno and never throw: they run on the I/O
// thread, where an escaping exception would end the process.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace torpor {

class Disk {
 public:
  virtual ~Disk() = default;
  virtual uint64_t size() const = 0;
  virtual bool read_only() const = 0;
  // [offset, offset+len) must lie inside size(); -EINVAL otherwise.
  virtual int read(uint64_t offset, void* dst, size_t len) = 0;
  // -EROFS on a read-only disk.
  virtual int write(uint64_t offset, const void* src, size_t len) = 0;
  // Makes every completed write durable.
  virtual int flush() = 0;
  // Hint that [offset, offset+len) is no longer used: its contents become
  // unspecified (a layer may drop its copy, so an older one shows again).
  // -EOPNOTSUPP when the disk does not take the hint.
  virtual int discard(uint64_t offset, uint64_t len) { return -EOPNOTSUPP; }
};

// True when [offset, offset+len) lies inside a disk of `size` bytes (no overflow).
inline bool disk_range_ok(uint64_t size, uint64_t offset, uint64_t len) {
  return offset <= size && len <= size - offset;
}

}  // namespace torpor
