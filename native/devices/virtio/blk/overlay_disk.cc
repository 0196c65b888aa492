#include "devices/virtio/blk/overlay_disk.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "base/file_io.h"
#include "common/error.h"

namespace torpor {

namespace {

// One map slot: this header, then the bitmap, padded to a 4 KiB multiple.
// Little-endian, described in docs/overlay.md.
struct MapHeader {
  char magic[8];          // "TRPOVMAP"
  uint32_t version;       // 1
  uint32_t block_size;    // 4096
  uint64_t disk_size;     // bytes
  uint64_t generation;    // 1, 2, ...: the valid slot with the highest wins
  uint64_t bitmap_bytes;  // ceil(blocks / 8)
  uint64_t allocated;     // number of bits set
  uint64_t checksum;      // FNV-1a 64 over bytes [0, 48) of this header, then the bitmap
  uint64_t reserved;      // 0
};
static_assert(sizeof(MapHeader) == 64);
constexpr char kMagic[8] = {'T', 'R', 'P', 'O', 'V', 'M', 'A', 'P'};
constexpr size_t kChecksummedHeader = offsetof(MapHeader, checksum);

uint64_t fnv1a(uint64_t h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t slot_checksum(const MapHeader& h, const uint8_t* bitmap, size_t n) {
  uint64_t sum = fnv1a(0xcbf29ce484222325ull, reinterpret_cast<const uint8_t*>(&h), kChecksummedHeader);
  return fnv1a(sum, bitmap, n);
}

uint64_t slot_bytes(uint64_t bitmap_bytes) { return (sizeof(MapHeader) + bitmap_bytes + 4095) / 4096 * 4096; }

}  // namespace

OverlayDisk::OverlayDisk(std::unique_ptr<Disk> lower, const std::string& data_path, uint64_t size, bool read_only)
    : lower_(std::move(lower)), size_(size), read_only_(read_only) {
  if (size_ == 0 || size_ % 512) throw Error(code::kInvalidArgument, "overlay: disk size must be a non-zero multiple of 512");
  blocks_ = (size_ + kBlockSize - 1) / kBlockSize;
  bitmap_.assign((blocks_ + 7) / 8, 0);
  std::string map_file = map_path(data_path);
  int flags = read_only_ ? O_RDONLY : (O_RDWR | O_CREAT);
  try {
    data_fd_ = ::open(data_path.c_str(), flags | O_CLOEXEC, 0644);
    if (data_fd_ < 0) throw_sys_error(code::kIo, "open overlay " + data_path);
    map_fd_ = ::open(map_file.c_str(), flags | O_CLOEXEC, 0644);
    if (map_fd_ < 0) throw_sys_error(code::kIo, "open overlay map " + map_file);
    load_map(map_file);
    struct stat st;
    if (::fstat(data_fd_, &st) != 0) throw_sys_error(code::kIo, "stat overlay " + data_path);
    if (generation_ == 0) {
      // No map was ever persisted: whatever the data file holds is
      // unreferenced; start from an empty sparse file of the disk's size.
      if (!read_only_) {
        if (::ftruncate(data_fd_, 0) != 0 || ::ftruncate(data_fd_, static_cast<off_t>(size_)) != 0)
          throw_sys_error(code::kIo, "size overlay " + data_path);
        // Their entries are made durable by the first flush (sync_new_files), through this fd.
        new_files_dir_fd_ = ::open(file_io::parent_dir(data_path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (new_files_dir_fd_ < 0) throw_sys_error(code::kIo, "open the directory of " + data_path);
      }
    } else if (static_cast<uint64_t>(st.st_size) != size_) {
      throw Error(code::kIo, "overlay " + data_path + " does not match its map (size " + std::to_string(st.st_size) +
                                 ", expected " + std::to_string(size_) + ")");
    }
  } catch (...) {
    if (data_fd_ >= 0) ::close(data_fd_);
    if (map_fd_ >= 0) ::close(map_fd_);
    if (new_files_dir_fd_ >= 0) ::close(new_files_dir_fd_);
    throw;
  }
}

OverlayDisk::~OverlayDisk() {
  if (data_fd_ >= 0) ::close(data_fd_);
  if (map_fd_ >= 0) ::close(map_fd_);
  if (new_files_dir_fd_ >= 0) ::close(new_files_dir_fd_);
}

void OverlayDisk::load_map(const std::string& map_file) {
  struct stat st;
  if (::fstat(map_fd_, &st) != 0) throw_sys_error(code::kIo, "stat overlay map " + map_file);
  if (st.st_size == 0) return;  // fresh
  uint64_t slot = slot_bytes(bitmap_.size());
  std::vector<uint8_t> buf(slot);
  uint64_t best_gen = 0;
  std::vector<uint8_t> best;
  bool other_size = false;
  // A slot whose header names generation >= 2 proves an earlier flush
  // completed; without one, a map that fails its checks can only be a torn
  // first persist, which promised the guest nothing yet.
  bool had_flushed = false;
  for (int i = 0; i < 2; i++) {
    long long n = file_io::pread_upto(map_fd_, buf.data(), buf.size(), i * slot);
    if (n < 0) throw_sys_error(code::kIo, "read overlay map " + map_file, static_cast<int>(-n));
    if (static_cast<size_t>(n) < sizeof(MapHeader)) continue;
    MapHeader h;
    std::memcpy(&h, buf.data(), sizeof h);
    if (std::memcmp(h.magic, kMagic, 8) || h.version != 1 || h.block_size != kBlockSize) continue;
    if (h.generation >= 2) had_flushed = true;
    if (h.disk_size != size_ || h.bitmap_bytes != bitmap_.size()) {
      other_size = true;
      continue;
    }
    if (static_cast<uint64_t>(n) < sizeof(MapHeader) + h.bitmap_bytes) continue;
    if (slot_checksum(h, buf.data() + sizeof h, h.bitmap_bytes) != h.checksum) continue;
    if (h.generation > best_gen) {
      best_gen = h.generation;
      best.assign(buf.begin() + sizeof h, buf.begin() + sizeof h + h.bitmap_bytes);
    }
  }
  if (best_gen == 0) {
    if (other_size) throw Error(code::kInvalidArgument, "overlay map " + map_file + " is for a disk of another size");
    if (had_flushed) throw Error(code::kIo, "overlay map " + map_file + " is corrupt (no valid slot)");
    return;  // torn first persist: fresh
  }
  bitmap_ = std::move(best);
  // Bits past the last block would make allocated() lie; the checksum
  // covered them, but a map we did not write could still set them.
  if (blocks_ % 8) bitmap_.back() &= static_cast<uint8_t>((1u << (blocks_ % 8)) - 1);
  allocated_count_ = 0;
  for (uint8_t b : bitmap_) allocated_count_ += static_cast<uint64_t>(std::popcount(b));
  generation_ = best_gen;
}

uint64_t OverlayDisk::block_bytes(uint64_t block) const {
  return std::min<uint64_t>(kBlockSize, size_ - block * kBlockSize);
}

void OverlayDisk::mark(uint64_t first, uint64_t count) {
  for (uint64_t b = first; b < first + count; b++) {
    uint8_t bit = static_cast<uint8_t>(1u << (b % 8));
    if (!(bitmap_[b / 8] & bit)) {
      bitmap_[b / 8] |= bit;
      allocated_count_++;
      map_dirty_ = true;
    }
  }
}

int OverlayDisk::read_lower(uint64_t offset, uint8_t* dst, size_t len) {
  uint64_t lower_size = lower_ ? lower_->size() : 0;
  size_t from_lower = offset < lower_size ? static_cast<size_t>(std::min<uint64_t>(len, lower_size - offset)) : 0;
  if (from_lower) {
    int rc = lower_->read(offset, dst, from_lower);
    if (rc < 0) return rc;
  }
  std::memset(dst + from_lower, 0, len - from_lower);
  return 0;
}

int OverlayDisk::read(uint64_t offset, void* dst, size_t len) {
  if (!disk_range_ok(size_, offset, len)) return -EINVAL;
  auto* out = static_cast<uint8_t*>(dst);
  while (len > 0) {
    // The longest run of blocks with the same allocation state.
    uint64_t block = offset / kBlockSize;
    bool alloc = allocated(block);
    uint64_t run_end = (block + 1) * kBlockSize;
    while (run_end < offset + len && allocated(run_end / kBlockSize) == alloc) run_end += kBlockSize;
    size_t n = static_cast<size_t>(std::min<uint64_t>(len, run_end - offset));
    int rc = alloc ? file_io::pread_all(data_fd_, out, n, offset) : read_lower(offset, out, n);
    if (rc < 0) return rc;
    out += n;
    offset += n;
    len -= n;
  }
  return 0;
}

int OverlayDisk::write(uint64_t offset, const void* src, size_t len) {
  if (read_only_) return -EROFS;
  if (!disk_range_ok(size_, offset, len)) return -EINVAL;
  const auto* in = static_cast<const uint8_t*>(src);
  while (len > 0) {
    uint64_t block = offset / kBlockSize;
    uint64_t in_block = offset % kBlockSize;
    if (in_block == 0) {
      // Whole blocks (the disk's short last block counts as whole when the
      // write reaches the end of the disk): one write, no copy-up.
      uint64_t run = (offset + len == size_) ? len : len / kBlockSize * kBlockSize;
      if (run > 0) {
        int rc = file_io::pwrite_all(data_fd_, in, run, offset);
        if (rc < 0) return rc;
        data_dirty_ = true;
        mark(block, (run + kBlockSize - 1) / kBlockSize);
        in += run;
        offset += run;
        len -= run;
        continue;
      }
    }
    // Part of one block.
    uint64_t bytes = block_bytes(block);
    size_t n = static_cast<size_t>(std::min<uint64_t>(len, bytes - in_block));
    int rc;
    if (allocated(block)) {
      rc = file_io::pwrite_all(data_fd_, in, n, offset);
    } else {
      // Copy the block up from the lower disk, then patch it.
      uint8_t buf[kBlockSize];
      rc = read_lower(block * kBlockSize, buf, bytes);
      if (rc == 0) {
        std::memcpy(buf + in_block, in, n);
        rc = file_io::pwrite_all(data_fd_, buf, bytes, block * kBlockSize);
      }
    }
    if (rc < 0) return rc;
    data_dirty_ = true;
    mark(block, 1);
    in += n;
    offset += n;
    len -= n;
  }
  return 0;
}

int OverlayDisk::discard(uint64_t offset, uint64_t len) {
  if (read_only_) return -EROFS;
  if (!disk_range_ok(size_, offset, len)) return -EINVAL;
  uint64_t first = (offset + kBlockSize - 1) / kBlockSize;
  // The disk's short last block counts as whole when the range reaches the end.
  uint64_t end = offset + len == size_ ? blocks_ : (offset + len) / kBlockSize;
  for (uint64_t b = first; b < end; b++) {
    if (!allocated(b)) continue;
    uint64_t run = b;
    while (run < end && allocated(run)) run++;
    uint64_t from = b * kBlockSize, bytes = std::min<uint64_t>(run * kBlockSize, size_) - from;
    if (::fallocate(data_fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from),
                    static_cast<off_t>(bytes)) != 0)
      return -errno;
    for (uint64_t i = b; i < run; i++) {
      bitmap_[i / 8] &= static_cast<uint8_t>(~(1u << (i % 8)));
      allocated_count_--;
    }
    map_dirty_ = true;
    b = run;
  }
  return 0;
}

int OverlayDisk::flush() {
  if (read_only_) return 0;
  if (data_dirty_) {
    if (::fdatasync(data_fd_) != 0) return -errno;
    data_dirty_ = false;
  }
  if (!map_dirty_) return 0;
  if (int rc = sync_new_files(); rc < 0) return rc;
  return persist_map();
}

void OverlayDisk::freeze() {
  read_only_ = true;
  if (new_files_dir_fd_ >= 0) ::close(new_files_dir_fd_);
  new_files_dir_fd_ = -1;
}

// Before the first map slot lands: the data file's size and both files' directory entries. A
// crash before this leaves at worst no files, or files with no valid slot: a fresh overlay. A
// valid slot never lands where its data file could be missing or unsized.
int OverlayDisk::sync_new_files() {
  if (new_files_dir_fd_ < 0) return 0;
  if (::fdatasync(data_fd_) != 0 || ::fsync(new_files_dir_fd_) != 0) return -errno;
  ::close(new_files_dir_fd_);
  new_files_dir_fd_ = -1;
  return 0;
}

int OverlayDisk::persist_map() {
  uint64_t gen = generation_ + 1;
  uint64_t slot = slot_bytes(bitmap_.size());
  std::vector<uint8_t> buf(slot, 0);
  MapHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = 1;
  h.block_size = kBlockSize;
  h.disk_size = size_;
  h.generation = gen;
  h.bitmap_bytes = bitmap_.size();
  h.allocated = allocated_count_;
  h.checksum = slot_checksum(h, bitmap_.data(), bitmap_.size());
  std::memcpy(buf.data(), &h, sizeof h);
  std::memcpy(buf.data() + sizeof h, bitmap_.data(), bitmap_.size());
  // Write the slot the last persisted map does not live in.
  int rc = file_io::pwrite_all(map_fd_, buf.data(), buf.size(), (gen % 2) * slot);
  if (rc < 0) return rc;
  if (::fdatasync(map_fd_) != 0) return -errno;
  generation_ = gen;
  map_dirty_ = false;
  return 0;
}

}  // namespace torpor
