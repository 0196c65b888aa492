// The per-sandbox copy-on-write layer over a read-only lower disk.
//
// Format (docs/overlay.md): a sparse data file holding written blocks at the
// same offsets as on the disk, and an allocation map (one bit per 4096-byte
// block) in a side file `<data>.map` with two checksummed slots written
// alternately, so a crash while persisting the map leaves the previous one.
//
// Reads take allocated blocks from the data file and the rest from the lower
// disk (zeros when there is none). Writes always land in the data file; a
// write that covers part of an unallocated block first copies the block up
// from the lower disk. flush() = fdatasync(data), write the map slot,
// fdatasync(map): after it returns, everything written before it survives a
// crash; blocks written after the last flush may be lost (the map does not
// point at them yet), never half-visible. A new overlay's files reach the
// disk's directory at its first flush (fsync of the directory, before the
// first map slot), not when they are created: until then a crash may lose
// them, which loses nothing the guest was promised (a missing overlay opens
// as a fresh one), and a restore does not wait for a directory sync. The
// directory is opened when the files are created and kept until then: a
// flush runs on a device thread whose seccomp filter refuses openat.
//
// Not thread-safe: the virtio-blk device calls it under its transport's lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "devices/virtio/blk/disk.h"

namespace torpor {

class OverlayDisk final : public Disk {
 public:
  static constexpr uint32_t kBlockSize = 4096;

  // Opens (or creates) `data_path` and its map. `lower` may be null (an
  // overlay-only disk). `size` must be a multiple of 512. With read_only the
  // files are opened read-only and must exist.
  // Throws Error(IO_ERROR) when a file cannot be opened or the map is
  // corrupt, Error(INVALID_ARGUMENT) when the map describes another disk.
  // One writer per overlay: the sandbox store's directory lock ensures it
  // (a machine keeps its devices until it is collected, after stop()).
  OverlayDisk(std::unique_ptr<Disk> lower, const std::string& data_path, uint64_t size, bool read_only = false);
  ~OverlayDisk() override;
  OverlayDisk(const OverlayDisk&) = delete;
  OverlayDisk& operator=(const OverlayDisk&) = delete;

  uint64_t size() const override { return size_; }
  bool read_only() const override { return read_only_; }
  int read(uint64_t offset, void* dst, size_t len) override;
  int write(uint64_t offset, const void* src, size_t len) override;
  int flush() override;
  // Drops the overlay's copy of every allocated block wholly inside the
  // range (punches a hole, clears its bit): the block reads from the layer
  // below again and stops using host disk space. Partial blocks are kept.
  int discard(uint64_t offset, uint64_t len) override;

  // No more writes (a capture freezes this top under a new one), after a flush: a top never
  // written lets go of the directory it kept for its first flush; it holds nothing to make
  // durable, and a frozen layer keeps two fds, not three.
  void freeze();

  static std::string map_path(const std::string& data_path) { return data_path + ".map"; }
  // False past the overlay's last block: a chain's layers may have different
  // sizes (a disk grown beyond its template), and a merge asks every layer.
  bool allocated(uint64_t block) const { return block < blocks_ && ((bitmap_[block / 8] >> (block % 8)) & 1); }
  uint64_t allocated_blocks() const { return allocated_count_; }
  uint64_t generation() const { return generation_; }  // of the map last persisted
  uint64_t lower_size() const { return lower_ ? lower_->size() : 0; }
  // Puts another lower disk under this overlay and hands back the old one.
  // The caller vouches that it reads the same bytes (a merge of the frozen
  // layers it replaces) and has the same size; under the device's lock.
  std::unique_ptr<Disk> replace_lower(std::unique_ptr<Disk> lower) {
    lower_.swap(lower);
    return lower;
  }

 private:
  uint64_t block_bytes(uint64_t block) const;  // 4096, or less for the disk's last block
  void mark(uint64_t first_block, uint64_t count);
  int read_lower(uint64_t offset, uint8_t* dst, size_t len);
  int persist_map();
  int sync_new_files();
  void load_map(const std::string& map_file);

  std::unique_ptr<Disk> lower_;
  uint64_t size_;
  bool read_only_;
  int data_fd_ = -1;
  int map_fd_ = -1;
  uint64_t blocks_ = 0;
  std::vector<uint8_t> bitmap_;
  uint64_t allocated_count_ = 0;
  uint64_t generation_ = 0;
  bool data_dirty_ = false;
  bool map_dirty_ = false;
  // The directory of files this overlay created, whose entries are not known to be on disk
  // yet: fsynced and closed at the first flush (sync_new_files); -1 once done, or never needed.
  int new_files_dir_fd_ = -1;
};

}  // namespace torpor
