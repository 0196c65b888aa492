// Replaces a small file so that a crash leaves either the old contents or the
// new, never a mix or nothing: the new bytes go to a temporary file beside it,
// are fsynced, renamed over the file, and the directory is fsynced so the
// rename itself survives. All of it in one call, so that lib/ can do it in one
// round on libuv's thread pool (meta.json, a snapshot directory's `current`)
// instead of one round per step.
#pragma once

#include <string>
#include <string_view>

namespace torpor {

// `tmp` must be in the same directory as `path` (rename(2) within one
// directory). On failure the temporary file is removed and `path` is as it was;
// throws Error (PERMISSION_DENIED, IO_ERROR) with errno.
void replace_file_durably(const std::string& tmp, const std::string& path, std::string_view data);

}  // namespace torpor
