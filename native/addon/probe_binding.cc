#include "addon/probe_binding.h"

#include "addon/addon_state.h"
#include "common/error.h"
#include "vmm/host_probe.h"

namespace torpor {

Napi::Value probe_binding(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    std::string device = "/dev/kvm";
    if (!info[0].IsUndefined() && !info[0].IsNull()) {
      if (!info[0].IsString()) throw Error(code::kInvalidArgument, "devicePath must be a string");
      device = info[0].As<Napi::String>().Utf8Value();
    }
    HostProbeResult r = probe_host(device);
    Napi::Object o = Napi::Object::New(env);
    o.Set("device", r.device);
    o.Set("apiVersion", r.api_version);
    o.Set("hostKind", host_kind_name(r.host_kind));
    o.Set("cpuVendor", r.cpu_vendor);
    Napi::Object caps = Napi::Object::New(env);
    for (const auto& [name, present] : r.capabilities) caps.Set(name, present);
    o.Set("capabilities", caps);
    Napi::Object values = Napi::Object::New(env);
    for (const auto& [name, value] : r.capability_values) values.Set(name, value);
    o.Set("capabilityValues", values);
    Napi::Array missing = Napi::Array::New(env, r.missing.size());
    for (uint32_t i = 0; i < r.missing.size(); i++) missing.Set(i, r.missing[i]);
    o.Set("missing", missing);
    return o;
  });
}

}  // namespace torpor
