#include "snapshot/generation_layout.h"

namespace torpor {

std::string generation_dir_name(uint64_t n) { return kGenerationPrefix + std::to_string(n); }

std::string disk_overlay_file(size_t disk) { return "disk" + std::to_string(disk) + ".overlay"; }

GenerationLayout generation_layout(uint64_t n, size_t disks) {
  GenerationLayout g;
  g.dir = generation_dir_name(n);
  g.state = g.dir + "/" + kStateFile;
  g.memory = g.dir + "/" + kMemoryLayerFile;
  g.manifest = g.dir + "/" + kManifestFile;
  for (size_t i = 0; i < disks; i++) g.disk_overlays.push_back(g.dir + "/" + disk_overlay_file(i));
  return g;
}

}  // namespace torpor
