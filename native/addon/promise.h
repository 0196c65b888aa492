// The one way the addon settles a promise it returned, whichever path ends
// the work: a worker's OnOK, an event a native thread posted through the
// EventBridge, or a call refused before any work started. Resolved with a
// value when there is no error code; else rejected with a TorporError made
// from the code and message (make_js_error: lib/errors.ts maps the code), or
// with an error object JS code threw.
//
// Raw N-API underneath, its failures ignored: settling also runs from
// thread-safe-function callbacks, where an environment being torn down
// refuses JS and node-addon-api's wrappers would make that a fatal error.
// JS thread only.
#pragma once

#include "addon/napi_config.h"

#include <string>
#include <utility>

namespace torpor {

class PendingPromise {
 public:
  // A new promise (what the binding returns to JS) and what settles it.
  // Throws Error(INTERNAL) when N-API refuses.
  static std::pair<PendingPromise, Napi::Promise> make(Napi::Env env);

  // `code` empty: resolves with `value` (undefined when empty); else rejects
  // with TorporError(code, message). Only the first settle counts.
  void settle(Napi::Env env, const std::string& code, const std::string& message, Napi::Value value = Napi::Value());
  // Rejects with an error object JS code threw (a constructor that failed).
  void reject_with(Napi::Env env, Napi::Value error);

 private:
  explicit PendingPromise(napi_deferred deferred) : deferred_(deferred) {}
  napi_deferred deferred_ = nullptr;  // nullptr once settled
};

// A promise already settled as PendingPromise::settle does (a call refused
// before it started, or one done at once).
Napi::Promise settled_promise(Napi::Env env, const std::string& code, const std::string& message,
                              Napi::Value value = Napi::Value());

}  // namespace torpor
