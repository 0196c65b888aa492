// Bounds of the snapshot layer merges (machine_merge.cc says why and when).
#pragma once

#include <cstddef>

namespace torpor {

// A memory chain with this many of its own layers (inside the snapshot directory) is
// merged into one full layer off the capture path.
inline constexpr size_t kMemoryMergeAt = 8;
// A capture whose memory chain would grow past this writes a full layer
// instead (a restore never reads more), and waits for a merge in flight first.
inline constexpr size_t kMemoryChainBound = 32;
// Own diffs over another directory's layers merge into one diff while their
// pages fit in this much memory (held while merging); beyond, a full layer.
inline constexpr uint64_t kDiffMergeMaxBytes = 256ull << 20;
// This many own frozen overlays on a disk are merged into one.
inline constexpr size_t kDiskMergeAt = 8;
// A capture that would leave a disk with this many own frozen overlays waits
// for a merge in flight (a machine captured faster than it merges).
inline constexpr size_t kDiskLayerBound = 24;

}  // namespace torpor
