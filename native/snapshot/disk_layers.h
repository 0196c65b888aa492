// The disk as a chain of layers: a read-only base image, overlays frozen at
// earlier generations (opened read-only), and a writable top overlay that
// takes the guest's writes. Built from OverlayDisk (docs/overlay.md), each
// layer taking the one below as its lower disk.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "devices/virtio/blk/disk.h"

namespace torpor {

// base_image: the template's raw image ("" = none: reads of never-written
// blocks return zeros). frozen_overlays: oldest first, opened read-only.
// top_overlay: created if missing; "" = a read-only chain. Throws
// Error(IO_ERROR) / Error(INVALID_ARGUMENT) as OverlayDisk does.
std::unique_ptr<Disk> open_disk_chain(const std::string& base_image, const std::vector<std::string>& frozen_overlays,
                                      const std::string& top_overlay, uint64_t size);

// Merges the frozen overlays (oldest first) into one new overlay at out_path
// (data + map, flushed), holding every block any of them holds, with the
// newest copy. The base image is not copied in: the result still overlays it.
// A set `cancel` stops it between runs of blocks (Error(INVALID_STATE), nothing
// left at out_path or its .tmp): a machine that stops does not wait for it.
void merge_disk_layers(const std::string& base_image, const std::vector<std::string>& frozen,
                       const std::string& out_path, uint64_t size, const std::atomic<bool>* cancel = nullptr);

}  // namespace torpor
