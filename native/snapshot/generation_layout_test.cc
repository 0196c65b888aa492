// The one place that names a generation's files.
#include "snapshot/generation_layout.h"

#include "test/check.h"

using namespace torpor;

TEST("generation layout: every file of gen-<n> relative to the snapshot directory") {
  GenerationLayout g = generation_layout(12, 2);
  CHECK_STR_EQ(g.dir, "gen-12");
  CHECK_STR_EQ(g.state, "gen-12/vm.state");
  CHECK_STR_EQ(g.memory, "gen-12/mem.layer");
  CHECK_STR_EQ(g.manifest, "gen-12/manifest.json");
  CHECK_EQ(g.disk_overlays.size(), size_t{2});
  CHECK_STR_EQ(g.disk_overlays[1], "gen-12/disk1.overlay");
  CHECK(generation_layout(1).disk_overlays.empty());
}
