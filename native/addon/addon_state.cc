#include "addon/addon_state.h"

#include <cstdlib>
#include <mutex>
#include <set>

#include "vmm/machine.h"

namespace torpor {

namespace {

std::mutex g_live_mu;
std::set<Machine*>* g_live = new std::set<Machine*>();  // never destroyed: used during exit
std::atomic<bool> g_exiting{false};

// process.exit() (and a fatal uncaught exception) end the main thread's
// environment without its cleanup hooks; stop the vCPU and I/O threads here
// so none is inside N-API or our code while the process tears down.
void stop_all_at_exit() {
  g_exiting.store(true);
  std::lock_guard<std::mutex> lock(g_live_mu);
  for (Machine* m : *g_live) {
    try {
      m->stop();
    } catch (...) {
    }
  }
}

}  // namespace

void register_live_machine(Machine* m) {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(stop_all_at_exit); });
  std::lock_guard<std::mutex> lock(g_live_mu);
  g_live->insert(m);
}

void unregister_live_machine(Machine* m) {
  std::lock_guard<std::mutex> lock(g_live_mu);
  g_live->erase(m);
}

bool process_exiting() { return g_exiting.load(); }

AddonState* addon_state(Napi::Env env) { return env.GetInstanceData<AddonState>(); }

Napi::Error make_js_error(Napi::Env env, const char* code, const std::string& message, int err) {
  AddonState* st = addon_state(env);
  if (st && !st->error_factory.IsEmpty()) {
    std::vector<napi_value> args = {Napi::String::New(env, code), Napi::String::New(env, message)};
    if (err) args.push_back(Napi::Number::New(env, err));
    napi_value result;
    napi_status s = napi_call_function(env, env.Undefined(), st->error_factory.Value(), args.size(), args.data(), &result);
    if (s == napi_ok) {
      Napi::Value v(env, result);
      if (v.IsObject()) return Napi::Error(env, result);
    }
    // The factory threw or returned junk: fall through to a plain error.
    bool pending = false;
    napi_is_exception_pending(env, &pending);
    if (pending) {
      napi_value ignored;
      napi_get_and_clear_last_exception(env, &ignored);
    }
  }
  Napi::Error e = Napi::Error::New(env, message);
  e.Set("code", Napi::String::New(env, code));
  if (err) e.Set("errno", Napi::Number::New(env, err));
  return e;
}

}  // namespace torpor
