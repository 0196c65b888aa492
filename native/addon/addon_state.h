// Per-environment state of the addon (one per Node main thread or worker):
// the error factory handed over by lib/native.ts.
//
// And the process-wide list of live machines, so an atexit handler can stop
// their threads when process.exit() ends the process without running the
// environment's cleanup hooks.
#pragma once

#include "addon/napi_config.h"

#include <atomic>
#include <string>

namespace torpor {

class Machine;

struct AddonState {
  Napi::FunctionReference error_factory;
  Napi::FunctionReference machine_ctor;  // MachineWrap's class, for machines built on a worker (restore)
};

AddonState* addon_state(Napi::Env env);

// Builds the error a JS caller sees: through the factory when set (a
// TorporError subclass), else a plain Error with `code`.
Napi::Error make_js_error(Napi::Env env, const char* code, const std::string& message, int err = 0);

// guarded(env, f) (addon_state_inl.h) runs f and turns every C++ exception
// into a pending JS error made by the factory: nothing crosses N-API.

// Process-wide registry used at process exit.
void register_live_machine(Machine* m);
void unregister_live_machine(Machine* m);
// True once the process is exiting: native threads must not call into N-API.
bool process_exiting();

}  // namespace torpor

#include "addon/addon_state_inl.h"
