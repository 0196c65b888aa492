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
// top_overlay: created if missing; "" = a read-only chain.
//
// Every layer keeps its own size: the base its file's, a frozen overlay the
// size it was written at (its data file's, which its map must confirm). A
// disk grown beyond its template therefore has smaller layers under larger
// ones, and reads past a layer's end see zeros (OverlayDisk, RawImage).
// `size` is the top overlay's (0: the largest layer's); a chain without a top
// is as large as its newest layer (a base alone: `size`, zeros past the end).
// A layer larger than one above it, or a `size` below the largest layer, is
// refused with Error(INVALID_ARGUMENT): a disk never shrinks under its data.
// Otherwise throws Error(IO_ERROR) / Error(INVALID_ARGUMENT) as OverlayDisk does.
std::unique_ptr<Disk> open_disk_chain(const std::string& base_image, const std::vector<std::string>& frozen_overlays,
                                      const std::string& top_overlay, uint64_t size);

// Merges the frozen overlays (oldest first) into one new overlay at out_path
// (data + map, flushed), holding every block any of them holds, with the
// newest copy. The base image is not copied in: the result still overlays it.
// Each layer is read at its own size; the result has `size` (0: the newest
// layer's), refused (INVALID_ARGUMENT) below any layer's.
// A set `cancel` stops it between runs of blocks (Error(INVALID_STATE), nothing
// left at out_path or its .tmp): a machine that stops does not wait for it.
void merge_disk_layers(const std::string& base_image, const std::vector<std::string>& frozen,
                       const std::string& out_path, uint64_t size, const std::atomic<bool>* cancel = nullptr);

}  // namespace torpor
