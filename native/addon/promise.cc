#include "addon/promise.h"

#include "addon/addon_state.h"
#include "common/error.h"

namespace torpor {

std::pair<PendingPromise, Napi::Promise> PendingPromise::make(Napi::Env env) {
  napi_deferred deferred;
  napi_value promise;
  if (napi_create_promise(env, &deferred, &promise) != napi_ok) throw Error(code::kInternal, "napi_create_promise failed");
  return {PendingPromise(deferred), Napi::Promise(env, promise)};
}

void PendingPromise::settle(Napi::Env env, const std::string& code, const std::string& message, Napi::Value value) {
  if (!deferred_) return;
  if (!code.empty()) {
    reject_with(env, make_js_error(env, code.c_str(), message).Value());
    return;
  }
  napi_deferred d = deferred_;
  deferred_ = nullptr;
  napi_resolve_deferred(env, d, value.IsEmpty() ? env.Undefined() : value);
}

void PendingPromise::reject_with(Napi::Env env, Napi::Value error) {
  if (!deferred_) return;
  napi_deferred d = deferred_;
  deferred_ = nullptr;
  napi_reject_deferred(env, d, error);
}

Napi::Promise settled_promise(Napi::Env env, const std::string& code, const std::string& message, Napi::Value value) {
  auto [pending, promise] = PendingPromise::make(env);
  pending.settle(env, code, message, value);
  return promise;
}

}  // namespace torpor
