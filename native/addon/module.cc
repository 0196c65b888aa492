// The addon's entry point: what lib/native-types.ts (NativeBinding) describes.
#include "addon/addon_state.h"
#include "addon/addon_state_inl.h"
#include "addon/file_binding.h"
#include "addon/lock_binding.h"
#include "addon/machine_binding.h"
#include "addon/net_socket_binding.h"
#include "addon/probe_binding.h"
#include "common/error.h"
#include "snapshot/generation_layout.h"
#include "vmm/kvm.h"
#include "vmm/vm_pool.h"

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

// restorePool(depth?) -> { depth, idle }: the VM shells kept for restores (vmm/vm_pool.h).
Napi::Value restore_pool(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() > 0 && !info[0].IsUndefined()) {
    if (!info[0].IsNumber() || info[0].As<Napi::Number>().DoubleValue() < 0 ||
        info[0].As<Napi::Number>().DoubleValue() > 16) {
      Napi::TypeError::New(env, "restorePool: depth must be 0..16").ThrowAsJavaScriptException();
      return env.Undefined();
    }
    vm_pool_set_depth(static_cast<size_t>(info[0].As<Napi::Number>().Uint32Value()));
  }
  Napi::Object o = Napi::Object::New(env);
  o.Set("depth", static_cast<double>(vm_pool_depth()));
  o.Set("idle", static_cast<double>(vm_pool_idle()));
  return o;
}

// kvmCallCount() -> KVM ioctls this process made so far, KVM_RUN aside (vmm/kvm.h).
Napi::Value kvm_call_count_binding(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(kvm_call_count()));
}

// snapshotLayout(generation, disks) -> { dir, state, memoryLayer, manifest, diskOverlays }: the
// files of generation `generation` relative to its snapshot directory (snapshot/generation_layout.h),
// for lib to find a generation's manifest without naming files itself. lib checks the arguments.
Napi::Value snapshot_layout(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    if (!info[0].IsNumber() || !info[1].IsNumber())
      throw Error(code::kInternal, "snapshotLayout: precondition failed (generation and disks are numbers)");
    GenerationLayout g = generation_layout(static_cast<uint64_t>(info[0].As<Napi::Number>().Int64Value()),
                                           info[1].As<Napi::Number>().Uint32Value());
    Napi::Object o = Napi::Object::New(env);
    o.Set("dir", g.dir);
    o.Set("state", g.state);
    o.Set("memoryLayer", g.memory);
    o.Set("manifest", g.manifest);
    Napi::Array disks = Napi::Array::New(env, g.disk_overlays.size());
    for (uint32_t i = 0; i < g.disk_overlays.size(); i++) disks.Set(i, g.disk_overlays[i]);
    o.Set("diskOverlays", disks);
    return o;
  });
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
  exports.Set("restorePool", Napi::Function::New(env, restore_pool, "restorePool"));
  exports.Set("kvmCallCount", Napi::Function::New(env, kvm_call_count_binding, "kvmCallCount"));
  exports.Set("tryLockFile", Napi::Function::New(env, try_lock_file_binding, "tryLockFile"));
  exports.Set("closeLockFile", Napi::Function::New(env, close_lock_file_binding, "closeLockFile"));
  exports.Set("replaceFileDurably", Napi::Function::New(env, replace_file_durably_binding, "replaceFileDurably"));
  exports.Set("netSocketPair", Napi::Function::New(env, net_socket_pair_binding, "netSocketPair"));
  exports.Set("closeNetSocket", Napi::Function::New(env, close_net_socket_binding, "closeNetSocket"));
  exports.Set("snapshotLayout", Napi::Function::New(env, snapshot_layout, "snapshotLayout"));
  exports.Set("describeSnapshot", Napi::Function::New(env, MachineWrap::describe_snapshot, "describeSnapshot"));
  return exports;
}

}  // namespace

}  // namespace torpor

static Napi::Object torpor_module_init(Napi::Env env, Napi::Object exports) { return torpor::init(env, exports); }

NODE_API_MODULE(torpor, torpor_module_init)
