#include "snapshot/disk_layers.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "base/file_io.h"
#include "common/error.h"
#include "devices/virtio/blk/overlay_disk.h"
#include "devices/virtio/blk/raw_image.h"

namespace torpor {
namespace {

// The size a frozen overlay was written at: its data file's (created at the
// disk's size, never extended). OverlayDisk then checks it against the map,
// which records the size in every slot, so a file whose size changed is
// refused rather than read at the wrong size.
uint64_t overlay_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw_sys_error(code::kIo, "stat overlay " + path);
  return static_cast<uint64_t>(st.st_size);
}

// Stacks the frozen overlays over `disk` (may be null), each at its own size,
// none smaller than the layer below it.
std::unique_ptr<Disk> stack_frozen(std::unique_ptr<Disk> disk, const std::vector<std::string>& frozen,
                                   std::vector<const OverlayDisk*>* layers = nullptr) {
  for (const std::string& path : frozen) {
    uint64_t below = disk ? disk->size() : 0;
    uint64_t own = overlay_size(path);
    if (own < below)
      throw Error(code::kInvalidArgument, "disk layer " + path + " (" + std::to_string(own) +
                                              " bytes) is smaller than the layer below it (" + std::to_string(below) + ")");
    auto layer = std::make_unique<OverlayDisk>(std::move(disk), path, own, /*read_only=*/true);
    if (layers) layers->push_back(layer.get());
    disk = std::move(layer);
  }
  return disk;
}

void refuse_shrink(uint64_t size, const std::unique_ptr<Disk>& chain, const char* what) {
  if (chain && size != 0 && size < chain->size())
    throw Error(code::kInvalidArgument, std::string(what) + " of " + std::to_string(size) +
                                            " bytes is smaller than its layers (" + std::to_string(chain->size()) +
                                            "): a disk never shrinks");
}

void remove_overlay_files(const std::string& path) {
  for (const std::string& p : {path, OverlayDisk::map_path(path)})
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) throw_sys_error(code::kIo, "remove " + p);
}

}  // namespace

std::unique_ptr<Disk> open_disk_chain(const std::string& base_image, const std::vector<std::string>& frozen_overlays,
                                      const std::string& top_overlay, uint64_t size) {
  if (base_image.empty() && frozen_overlays.empty() && top_overlay.empty())
    throw Error(code::kInvalidArgument, "a disk chain needs a base image or an overlay");
  // A base alone is the whole (read-only) disk: it takes the size asked for.
  if (frozen_overlays.empty() && top_overlay.empty()) return std::make_unique<RawImage>(base_image, size);
  std::unique_ptr<Disk> disk;
  if (!base_image.empty()) disk = std::make_unique<RawImage>(base_image);
  disk = stack_frozen(std::move(disk), frozen_overlays);
  refuse_shrink(size, disk, "a disk");
  if (top_overlay.empty()) return disk;
  // size 0: the largest layer's, the newest (a fresh config booting a generation's disk names
  // no size; a disk grown beyond its template then boots at its grown size).
  if (size == 0 && disk) size = disk->size();
  return std::make_unique<OverlayDisk>(std::move(disk), top_overlay, size);
}

void merge_disk_layers(const std::string& base_image, const std::vector<std::string>& frozen,
                       const std::string& out_path, uint64_t size, const std::atomic<bool>* cancel) {
  // The base image takes no part: the merged overlay lies over the same base
  // and holds exactly the blocks some frozen overlay holds, each block read
  // through the chain so the newest copy wins (a block discarded in a newer
  // overlay reads from the older one, as it does in the chain).
  (void)base_image;
  if (frozen.empty()) throw Error(code::kInvalidArgument, "nothing to merge: no frozen overlays");
  std::vector<const OverlayDisk*> layers;
  std::unique_ptr<Disk> chain = stack_frozen(nullptr, frozen, &layers);
  if (size == 0) size = chain->size();
  refuse_shrink(size, chain, "a merged disk layer");
  const uint64_t block_size = OverlayDisk::kBlockSize;
  const uint64_t blocks = (size + block_size - 1) / block_size;
  auto held = [&](uint64_t b) {
    return std::any_of(layers.begin(), layers.end(), [b](const OverlayDisk* l) { return l->allocated(b); });
  };

  const std::string tmp_path = out_path + ".tmp";
  remove_overlay_files(tmp_path);  // a leftover of an interrupted merge must not be reopened as a valid overlay
  try {
    OverlayDisk out(nullptr, tmp_path, size);
    // Runs of held blocks, up to 1 MiB per read/write.
    constexpr uint64_t kMaxRunBlocks = 256;
    std::vector<uint8_t> buf(kMaxRunBlocks * block_size);
    for (uint64_t b = 0; b < blocks;) {
      if (cancel && cancel->load(std::memory_order_relaxed)) throw Error(code::kInvalidState, "disk layer merge cancelled");
      if (!held(b)) {
        b++;
        continue;
      }
      uint64_t end = b + 1;
      while (end < blocks && end - b < kMaxRunBlocks && held(end)) end++;
      // Held blocks lie inside the chain (the newest layer is the largest);
      // past its end the merged layer holds nothing, as the chain reads zeros there.
      uint64_t from = b * block_size, bytes = std::min(end * block_size, chain->size()) - from;
      if (int rc = chain->read(from, buf.data(), bytes); rc < 0)
        throw_sys_error(code::kIo, "read frozen overlay while merging", -rc);
      if (int rc = out.write(from, buf.data(), bytes); rc < 0)
        throw_sys_error(code::kIo, "write merged overlay " + tmp_path, -rc);
      b = end;
    }
    if (int rc = out.flush(); rc < 0) throw_sys_error(code::kIo, "flush merged overlay " + tmp_path, -rc);
  } catch (...) {
    remove_overlay_files(tmp_path);
    throw;
  }
  // Map first, then data: a crash between leaves a map without its data
  // file, which opens as an error, never a data file without its map, which
  // would open as a fresh (empty) overlay.
  remove_overlay_files(out_path);
  if (::rename(OverlayDisk::map_path(tmp_path).c_str(), OverlayDisk::map_path(out_path).c_str()) != 0 ||
      ::rename(tmp_path.c_str(), out_path.c_str()) != 0)
    throw_sys_error(code::kIo, "rename merged overlay to " + out_path);
  if (int rc = file_io::fsync_parent_dir(out_path.c_str()); rc < 0)
    throw_sys_error(code::kIo, "sync directory of " + out_path, -rc);
}

}  // namespace torpor
