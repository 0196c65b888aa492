#include "addon/lock_binding.h"

#include <map>
#include <mutex>

#include "addon/addon_state.h"
#include "base/file_lock.h"
#include "common/error.h"

namespace torpor {

namespace {

// A lock tryLockFile handed out, and the environment (main thread or worker) that took it.
struct HeldLock {
  int fd;
  napi_env env;
};

// The locks tryLockFile handed out, by fd, so closeLockFile never closes an fd it did not open
// (a stale or forged number would otherwise close someone else's).
std::mutex g_held_mu;
std::map<int, HeldLock*>* g_held = new std::map<int, HeldLock*>();  // never destroyed: workers may close at exit

// The environment that took a lock ends (a worker thread ending or terminated): its JS can no
// longer release the lock, so the lock goes with it, as it would with the process. Registered
// when the lock is taken, before that sandbox's machine exists: cleanup hooks run last-in
// first-out, so the machine's hook (its teardown capture) runs before the lock is dropped.
void release_at_env_end(void* arg) {
  auto* held = static_cast<HeldLock*>(arg);
  {
    std::lock_guard<std::mutex> lock(g_held_mu);
    g_held->erase(held->fd);
  }
  Fd closing(held->fd);
  delete held;
}

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
      auto* held = new HeldLock{fd, env};
      {
        std::lock_guard<std::mutex> lock(g_held_mu);
        (*g_held)[fd] = held;
      }
      if (napi_add_env_cleanup_hook(env, release_at_env_end, held) != napi_ok) {
        // Without the hook the lock would outlive a worker that ends: give it back instead.
        {
          std::lock_guard<std::mutex> lock(g_held_mu);
          g_held->erase(fd);
        }
        Fd closing(fd);
        delete held;
        throw Error(code::kInternal, "tryLockFile: napi_add_env_cleanup_hook failed");
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
    HeldLock* held = nullptr;
    {
      std::lock_guard<std::mutex> lock(g_held_mu);
      auto it = g_held->find(fd);
      if (it == g_held->end()) throw Error(code::kInvalidArgument, "closeLockFile: not a held lock fd");
      if (it->second->env != napi_env(env)) throw Error(code::kInvalidArgument, "closeLockFile: the lock belongs to another thread");
      held = it->second;
      g_held->erase(it);
    }
    napi_remove_env_cleanup_hook(env, release_at_env_end, held);
    delete held;
    Fd closing(fd);  // close(2) drops the flock; its error (none expected on a regular file) changes nothing
    return env.Undefined();
  });
}

}  // namespace torpor
