// Paths of memory layers in a machine's state file (machine_snapshot.cc).
//
// A generation's memory chain names its layers bottom first: relative to the
// snapshot directory for the layers that directory holds ("gen-3/mem.layer",
// "layers/merged-...layer"), absolute for layers another, read-only directory
// holds (a template's, when a sandbox was restored from it into its own
// directory). Either way the name is data from disk: checked before it is
// used, and MemoryChain::open refuses a file whose identity is not what the
// layer above recorded (SNAPSHOT_INVALID), so a changed or swapped file is
// caught even when the name is well formed.
#pragma once

#include <string>

namespace torpor {

// The longest layer path a state file may hold (absolute ones included).
constexpr size_t kMaxLayerPath = 4096;

// SNAPSHOT_INVALID unless `p` is a plain relative path (no "..", not empty)
// or an absolute one without ".." components; never a NUL byte.
void check_layer_path(const std::string& p);

// The file a chain entry names (checked first): `dir`/p, or p itself when
// absolute. A machine restored into another directory keeps its source's
// layers this way, absolute, so its new directory's generations find them.
std::string resolve_layer_path(const std::string& dir, const std::string& p);

}  // namespace torpor
