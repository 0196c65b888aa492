// Memory layer paths in a state file: relative inside the snapshot directory,
// absolute for a template's layers; anything else is SNAPSHOT_INVALID.
#include "snapshot/layer_path.h"

#include <string>

#include "common/error.h"
#include "test/check.h"

using namespace torpor;

TEST("layer path: relative entries resolve inside the directory, absolute ones stay") {
  CHECK_STR_EQ(resolve_layer_path("/home/s/snapshots", "gen-2/mem.layer"), "/home/s/snapshots/gen-2/mem.layer");
  CHECK_STR_EQ(resolve_layer_path("/home/s/snapshots", "layers/merged-9-1.layer"), "/home/s/snapshots/layers/merged-9-1.layer");
  CHECK_STR_EQ(resolve_layer_path("/home/s/snapshots", "/home/templates/base/k/gen-1/mem.layer"),
           "/home/templates/base/k/gen-1/mem.layer");
  CHECK_STR_EQ(resolve_layer_path("/d", "a..b/mem.layer"), "/d/a..b/mem.layer");  // ".." only as a component
}

TEST("layer path: empty, '..' components, NUL bytes, '/' alone and overlong names are refused") {
  CHECK_THROWS_CODE(check_layer_path(""), "SNAPSHOT_INVALID");
  CHECK_THROWS_CODE(check_layer_path("/"), "SNAPSHOT_INVALID");
  CHECK_THROWS_CODE(check_layer_path("../other/gen-1/mem.layer"), "SNAPSHOT_INVALID");
  CHECK_THROWS_CODE(check_layer_path("gen-1/../../x"), "SNAPSHOT_INVALID");
  CHECK_THROWS_CODE(check_layer_path("/templates/base/../../etc/passwd"), "SNAPSHOT_INVALID");
  CHECK_THROWS_CODE(check_layer_path("gen-1/.."), "SNAPSHOT_INVALID");
  CHECK_THROWS_CODE(check_layer_path(std::string("gen-1\0x", 7)), "SNAPSHOT_INVALID");
  CHECK_THROWS_CODE(check_layer_path("/" + std::string(kMaxLayerPath, 'a')), "SNAPSHOT_INVALID");
  check_layer_path("/t/gen-1/mem.layer");
  check_layer_path("gen-1/mem.layer");
}
