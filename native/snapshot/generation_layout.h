// The names inside a machine's snapshot directory: the one place that says
// them (docs/snapshot.md). lib never builds a path inside a generation; it
// takes the paths a capture returns, or the ones a generation's manifest.json
// names, or asks the addon (snapshotLayout) for an old generation's.
//
//   <dir>/current                 "gen-<n>\n": the generation a restore loads
//   <dir>/gen-<n>/vm.state        envelope around the machine's state
//   <dir>/gen-<n>/mem.layer       memory layer (full or diff over the chain below)
//   <dir>/gen-<n>/disk<i>.overlay disk i's top layer frozen by this generation (+ .map)
//   <dir>/gen-<n>/manifest.json   what the generation names (for tools and lib)
//   <dir>/layers/, <dir>/tops/    merged layers, live disk tops (machine_merge.cc)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torpor {

inline constexpr const char* kCurrentFile = "current";
inline constexpr const char* kGenerationPrefix = "gen-";
inline constexpr const char* kStateFile = "vm.state";
inline constexpr const char* kMemoryLayerFile = "mem.layer";
inline constexpr const char* kManifestFile = "manifest.json";

// "gen-<n>"
std::string generation_dir_name(uint64_t n);
// "disk<i>.overlay"
std::string disk_overlay_file(size_t disk);

// A generation's files, relative to the snapshot directory.
struct GenerationLayout {
  std::string dir;       // gen-<n>
  std::string state;     // gen-<n>/vm.state
  std::string memory;    // gen-<n>/mem.layer
  std::string manifest;  // gen-<n>/manifest.json
  std::vector<std::string> disk_overlays;  // gen-<n>/disk<i>.overlay, one per disk asked for
};
GenerationLayout generation_layout(uint64_t n, size_t disks = 0);

}  // namespace torpor
