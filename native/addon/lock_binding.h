// tryLockFile(path) / closeLockFile(fd): the owner lock (base/file_lock.h) for
// lib/store/lock.ts. The fd stays a plain number in JS: it keeps no handle on
// the event loop, and the kernel releases the lock when the process dies; an env cleanup hook
// releases it when the thread (a worker) that took it ends.
#pragma once

#include "addon/napi_config.h"

namespace torpor {
Napi::Value try_lock_file_binding(const Napi::CallbackInfo& info);
Napi::Value close_lock_file_binding(const Napi::CallbackInfo& info);
}  // namespace torpor
