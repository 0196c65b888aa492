// Merging a machine's snapshot layers off the capture path: the memory chain
// into one full layer, and each disk's own frozen overlays into one overlay.
//
// Why: every generation adds a memory diff and freezes each disk's top. A
// restore reads the whole memory chain, and a disk chain of N frozen layers
// holds 2N fds (data + map) and an allocation bitmap per layer for the
// machine's life, walked on every read that misses the top. A sandbox paused
// every few minutes for a day would hold thousands.
//
// When: after a capture that lets the machine go on, and right after a
// restore (a sandbox's pause stops the machine, so its next connect is where
// the time to merge is). At most one merge job runs per machine, on a thread
// of its own, reading only frozen files (immutable once their generation is
// written). The next capture adopts what finished: memory as before (the
// next diff chains onto the merged layer), disks by swapping the layers below
// the live top for the merged one (the machine is paused there), so the
// generation it writes names the merged overlay and the old layers close. A
// machine that stops first cancels the job and removes its outputs.
//
// A disk merges only its own layers: the trailing frozen overlays inside the
// snapshot directory. A template's layers (absolute paths elsewhere) stay
// shared. Nothing here deletes a frozen layer: older generations may still
// name them (the sandbox store drops what its last generation no longer
// references).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <string>
#include <vector>

#include "common/error.h"
#include "devices/virtio/blk/blk_device.h"
#include "devices/virtio/blk/overlay_disk.h"
#include "snapshot/disk_layers.h"
#include "snapshot/layer_path.h"
#include "snapshot/memory_layer.h"
#include "vmm/machine.h"
#include "vmm/machine_merge.h"

namespace torpor {

namespace fs = std::filesystem;

namespace {

// How many entries at the end of `paths` are this directory's own (merge
// candidates): another directory's layers (a template's, a fork parent's)
// come first, and only the own ones after them merge.
template <typename Own>
size_t own_tail(const std::vector<std::string>& paths, Own own) {
  size_t n = 0;
  while (n < paths.size() && own(paths[paths.size() - 1 - n])) n++;
  return n;
}

// A memory chain names its own layers relative to the directory.
size_t own_memory_layers(const std::vector<std::string>& chain) {
  return own_tail(chain, [](const std::string& p) { return !p.empty() && p[0] != '/'; });
}

// A disk's frozen overlays as the machine holds them: its own ones are under `dir`.
size_t own_disk_layers(const std::string& dir, const std::vector<std::string>& frozen) {
  return own_tail(frozen, [&](const std::string& p) { return p.rfind(dir + "/", 0) == 0; });
}

void remove_overlay(const std::string& path) {
  ::unlink(path.c_str());
  ::unlink(OverlayDisk::map_path(path).c_str());
}

std::string merged_name(const char* what, uint64_t generation) {
  static std::atomic<uint64_t> seq{0};
  return std::string("layers/") + what + "-" + std::to_string(generation) + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(seq.fetch_add(1));
}

}  // namespace

void Machine::start_merges() {
  if (merge_ || snapshot_dir_.empty() || released_.load()) return;
  auto job = std::make_unique<LayerMerge>();
  job->dir = snapshot_dir_;
  // Memory: once 8 of its layers are this directory's own (they trail: another directory's
  // layers, a template's or a fork parent's, come first). Over another directory's bottom the
  // own diffs merge into one diff, so a template's memory is never copied in; over an own
  // bottom, the whole chain into one full layer.
  const size_t own_memory = own_memory_layers(mem_chain_);
  if (own_memory >= kMemoryMergeAt) {
    job->memory = true;
    job->mem_first = mem_chain_.size() - own_memory;
    job->mem_layers = own_memory;
    job->mem_merged = merged_name("merged", generation_) + ".layer";
    for (const auto& p : mem_chain_) job->mem_paths.push_back(resolve_layer_path(snapshot_dir_, p));
    job->ram_bytes = ram_->size();
  }
  for (size_t i = 0; i < config_.disks.size() && i < virtio_.size(); i++) {
    const BlkOptions& d = config_.disks[i];
    size_t own = own_disk_layers(snapshot_dir_, d.frozen_overlays);
    if (d.read_only || own < kDiskMergeAt) continue;
    VirtioBlkDevice* blk = virtio_blk_of(*virtio_[i].dev);
    if (!blk) continue;
    LayerMerge::DiskPart part;
    part.disk = i;
    part.first = d.frozen_overlays.size() - own;
    part.layers.assign(d.frozen_overlays.begin() + static_cast<std::ptrdiff_t>(part.first), d.frozen_overlays.end());
    part.merged = snapshot_dir_ + "/" + merged_name(("disk" + std::to_string(i)).c_str(), generation_) + ".overlay";
    part.size = blk->disk().size();
    job->disks.push_back(std::move(part));
  }
  if (!job->memory && job->disks.empty()) return;
  LayerMerge* j = job.get();
  try {
    fs::create_directories(snapshot_dir_ + "/layers");
    job->thread = std::thread([j] {
      // Disks first: small (the blocks written since the last merge), and
      // each one closes 2 fds per layer once adopted.
      for (auto& part : j->disks) {
        try {
          merge_disk_layers("", part.layers, part.merged, part.size, &j->cancel);
          ::chmod(part.merged.c_str(), 0444);
          ::chmod(OverlayDisk::map_path(part.merged).c_str(), 0444);
          part.ok = true;
        } catch (...) {
          // This disk's chain stays as it was; a later merge tries again.
        }
        j->disks_done.fetch_add(1, std::memory_order_release);  // the next capture may take it now
      }
      if (j->memory) {
        const std::string out = j->dir + "/" + j->mem_merged;
        try {
          if (j->mem_first > 0) {
            try {
              merge_diff_layers(j->mem_paths, j->mem_first, j->ram_bytes, out, kDiffMergeMaxBytes, &j->cancel);
            } catch (const Error& e) {
              if (std::string(e.code()) != code::kInvalidArgument) throw;
              // Too many pages to hold while merging: one full layer of the whole chain instead.
              j->mem_first = 0;
              j->mem_layers = j->mem_paths.size();
            }
          }
          if (j->mem_first == 0) merge_memory_layers(j->mem_paths, j->ram_bytes, out, &j->cancel);
          j->memory_ok = true;
        } catch (...) {
          // The chain stays as it was; the bound makes a later capture write a full layer.
        }
      }
      j->done.store(true);
    });
  } catch (...) {
    return;  // no thread (or no directory): no merge this time
  }
  merge_ = std::move(job);
}

bool Machine::merge_due() const {
  if (!merge_) return false;
  if (mem_chain_.size() + 1 >= kMemoryChainBound) return true;
  for (const auto& d : config_.disks)
    if (own_disk_layers(snapshot_dir_, d.frozen_overlays) + 1 >= kDiskLayerBound) return true;
  return false;
}

void Machine::adopt_merges(bool wait) {
  if (!merge_) return;
  LayerMerge& j = *merge_;
  if (wait && j.thread.joinable()) j.thread.join();
  const bool same_dir = j.dir == snapshot_dir_;
  // Disks as each one finishes, even while the memory merge (larger) goes on: a machine paused
  // soon after each restore would otherwise never get one in before its stop cancels the job.
  const size_t finished = j.disks_done.load(std::memory_order_acquire);
  for (size_t k = 0; k < finished && same_dir; k++) {
    LayerMerge::DiskPart& part = j.disks[k];
    if (!part.ok) continue;  // failed, or adopted already
    BlkOptions& d = config_.disks[part.disk];
    const auto at = d.frozen_overlays.begin() + static_cast<std::ptrdiff_t>(part.first);
    if (d.frozen_overlays.size() < part.first + part.layers.size() ||
        !std::equal(part.layers.begin(), part.layers.end(), at))
      continue;  // the chain changed under it (not expected: only captures append)
    std::vector<std::string> frozen(d.frozen_overlays.begin(), at);
    frozen.push_back(part.merged);
    frozen.insert(frozen.end(), at + static_cast<std::ptrdiff_t>(part.layers.size()), d.frozen_overlays.end());
    try {
      int rc = virtio_blk_replace_lower(*virtio_[part.disk].dev, open_disk_chain(d.base_path, frozen, "", part.size));
      if (rc < 0) continue;
    } catch (const Error&) {
      continue;
    }
    d.frozen_overlays = std::move(frozen);
    part.ok = false;  // adopted: not removed by drop_merge
  }
  if (!j.done.load()) return;
  if (j.thread.joinable()) j.thread.join();
  // Memory: only for the chain it merged (the machine may have written elsewhere since).
  if (j.memory_ok && same_dir && j.mem_first + j.mem_layers <= mem_chain_.size()) {
    const auto from = mem_chain_.begin() + static_cast<std::ptrdiff_t>(j.mem_first);
    std::vector<std::string> chain(mem_chain_.begin(), from);
    chain.push_back(j.mem_merged);
    chain.insert(chain.end(), from + static_cast<std::ptrdiff_t>(j.mem_layers), mem_chain_.end());
    mem_chain_ = std::move(chain);
    j.memory_ok = false;  // adopted: not removed below
  }
  drop_merge();
}

void Machine::drop_merge() {
  if (!merge_) return;
  merge_->cancel.store(true);
  if (merge_->thread.joinable()) merge_->thread.join();
  // What finished but was not adopted is nobody's: no generation names it.
  if (merge_->memory_ok) ::unlink((merge_->dir + "/" + merge_->mem_merged).c_str());
  for (auto& part : merge_->disks)
    if (part.ok) remove_overlay(part.merged);
  merge_.reset();
}

}  // namespace torpor
