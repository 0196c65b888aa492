#include "addon/event_bridge.h"

#include "addon/addon_state.h"

namespace torpor {

EventBridge::EventBridge(Napi::Env env, Napi::Function on_event) {
  tsfn_ = Tsfn::New(env, on_event, "torpor-machine", 0, 1);
  tsfn_.Unref(env);
  open_ = true;
}

EventBridge::~EventBridge() { close(); }

namespace {

// While Node tears an environment down it still drains queued calls but
// refuses to run JS: every N-API call that could (property sets, calls)
// then fails, and node-addon-api's wrappers turn such a failure into a fatal
// error. Probe with one such call first and drop the work if it fails.
bool can_run_js(napi_env env) {
  napi_value obj, val;
  if (napi_create_object(env, &obj) != napi_ok || napi_get_boolean(env, true, &val) != napi_ok) return false;
  return napi_set_named_property(env, obj, "probe", val) == napi_ok;
}

}  // namespace

void EventBridge::call_js(Napi::Env env, Napi::Function fn, std::nullptr_t*, Item* item) {
  std::unique_ptr<Item> owned(item);
  if (env == nullptr || !owned) return;  // being torn down: just free the item
  if (!can_run_js(env)) return;
  // A listener that throws leaves its exception pending; Node reports it as
  // an uncaught exception, like any callback's.
  try {
    owned->work(env, fn);
  } catch (...) {
  }
}

bool EventBridge::post(Work work) {
  if (process_exiting()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_) return false;
  auto* item = new Item{std::move(work)};
  if (tsfn_.NonBlockingCall(item) != napi_ok) {
    delete item;
    return false;
  }
  return true;
}

void EventBridge::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_) return;
  open_ = false;
  tsfn_.Release();
}

void EventBridge::hold(Napi::Env env) {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_ && holds_++ == 0) tsfn_.Ref(env);
}

void EventBridge::release_hold(Napi::Env env) {
  std::lock_guard<std::mutex> lock(mu_);
  if (holds_ > 0 && --holds_ == 0 && open_) tsfn_.Unref(env);
}

}  // namespace torpor
