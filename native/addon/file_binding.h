// replaceFileDurably(tmp, path, text): base/durable_file.h on libuv's thread
// pool, as one work item: lib/store writes meta.json and `current` with it
// (one round on the pool and one callback on the JS thread, where the same
// steps through node:fs/promises took eight of each).
#pragma once

#include "addon/napi_config.h"

namespace torpor {
Napi::Value replace_file_durably_binding(const Napi::CallbackInfo& info);
}  // namespace torpor
