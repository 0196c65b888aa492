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
// directory). Throws Error (PERMISSION_DENIED, OUT_OF_SPACE, IO_ERROR) with
// errno. A failure before the rename removes the temporary and leaves `path`
// as it was; one after it (opening or syncing the directory) leaves the new
// file in place, not known to be durable.
void replace_file_durably(const std::string& tmp, const std::string& path, std::string_view data);

}  // namespace torpor
