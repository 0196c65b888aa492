// Template part of addon_state.h.
#pragma once

#include <exception>

#include "common/error.h"

namespace torpor {

// Thrown (inside the addon only) when a JS exception is already pending,
// e.g. a getter on a config object threw: the entry point just returns.
struct JsExceptionPending {};

template <typename T>
T unwrap(Napi::Maybe<T> m) {
  if (m.IsNothing()) throw JsExceptionPending{};
  return m.Unwrap();
}

template <typename F>
Napi::Value guarded(Napi::Env env, F&& f) {
  try {
    return f();
  } catch (const JsExceptionPending&) {
  } catch (const Error& e) {
    make_js_error(env, e.code(), e.what(), e.sys_errno()).ThrowAsJavaScriptException();
  } catch (const std::exception& e) {
    make_js_error(env, code::kInternal, e.what()).ThrowAsJavaScriptException();
  } catch (...) {
    make_js_error(env, code::kInternal, "unknown native error").ThrowAsJavaScriptException();
  }
  return env.Undefined();
}

}  // namespace torpor
