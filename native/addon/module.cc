// The addon's entry point: what lib/native.d.ts (NativeBinding) describes.
#include "addon/addon_state.h"
#include "addon/machine_binding.h"
#include "addon/probe_binding.h"

namespace torpor {

namespace {

Napi::Value set_error_factory(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsFunction()) {
    Napi::TypeError::New(env, "setErrorFactory takes a function").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  addon_state(env)->error_factory = Napi::Persistent(info[0].As<Napi::Function>());
  return env.Undefined();
}

Napi::Value build_info(const Napi::CallbackInfo& info) {
  Napi::Object o = Napi::Object::New(info.Env());
  o.Set("version", "0.1.0");
  o.Set("compiler", "g++ " __VERSION__);
  return o;
}

Napi::Object init(Napi::Env env, Napi::Object exports) {
  env.SetInstanceData<AddonState>(new AddonState());
  exports.Set("setErrorFactory", Napi::Function::New(env, set_error_factory, "setErrorFactory"));
  exports.Set("probe", Napi::Function::New(env, probe_binding, "probe"));
  exports.Set("buildInfo", Napi::Function::New(env, build_info, "buildInfo"));
  Napi::Function machine = MachineWrap::define(env);
  addon_state(env)->machine_ctor = Napi::Persistent(machine);
  exports.Set("Machine", machine);
  exports.Set("restoreMachine", Napi::Function::New(env, MachineWrap::restore_machine, "restoreMachine"));
  exports.Set("buildMachine", Napi::Function::New(env, MachineWrap::build_machine, "buildMachine"));
  exports.Set("describeSnapshot", Napi::Function::New(env, MachineWrap::describe_snapshot, "describeSnapshot"));
  return exports;
}

}  // namespace

}  // namespace torpor

static Napi::Object torpor_module_init(Napi::Env env, Napi::Object exports) { return torpor::init(env, exports); }

NODE_API_MODULE(torpor, torpor_module_init)
