#include "addon/lock_binding.h"

#include <mutex>
#include <set>

#include "addon/addon_state.h"
#include "base/file_lock.h"
#include "common/error.h"

namespace torpor {

namespace {

// The fds tryLockFile handed out, so closeLockFile never closes an fd it did
// not open (a stale or forged number would otherwise close someone else's).
std::mutex g_held_mu;
std::set<int>* g_held = new std::set<int>();  // never destroyed: workers may close at exit

}  // namespace

// tryLockFile(path) -> { fd } when taken, else { ownerPid: number | null }.
Napi::Value try_lock_file_binding(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    if (!info[0].IsString()) throw Error(code::kInvalidArgument, "tryLockFile: path must be a string");
    std::string path = info[0].As<Napi::String>().Utf8Value();
    if (path.empty() || path.find('\0') != std::string::npos)
      throw Error(code::kInvalidArgument, "tryLockFile: path must be a non-empty string without NUL");
    FileLockAttempt attempt = try_lock_file(path);
    Napi::Object o = Napi::Object::New(env);
    if (attempt.fd.valid()) {
      int fd = attempt.fd.release();
      {
        std::lock_guard<std::mutex> lock(g_held_mu);
        g_held->insert(fd);
      }
      o.Set("fd", fd);
    } else if (attempt.owner) {
      o.Set("ownerPid", static_cast<double>(*attempt.owner));
    } else {
      o.Set("ownerPid", env.Null());
    }
    return o;
  });
}

// closeLockFile(fd): releases a lock tryLockFile took. INVALID_ARGUMENT for any other fd.
Napi::Value close_lock_file_binding(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    if (!info[0].IsNumber()) throw Error(code::kInvalidArgument, "closeLockFile: fd must be a number");
    int fd = info[0].As<Napi::Number>().Int32Value();
    {
      std::lock_guard<std::mutex> lock(g_held_mu);
      if (g_held->erase(fd) == 0) throw Error(code::kInvalidArgument, "closeLockFile: not a held lock fd");
    }
    Fd closing(fd);  // close(2) drops the flock; its error (none expected on a regular file) changes nothing
    return env.Undefined();
  });
}

}  // namespace torpor
