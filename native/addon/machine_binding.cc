#include "addon/machine_binding.h"
#include "addon/net_socket_binding.h"

#include <arpa/inet.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>

#include "addon/addon_state.h"
#include "addon/coded_worker.h"
#include "addon/js_values.h"
#include "addon/promise.h"
#include "common/error.h"
#include "vmm/reaper.h"

namespace torpor {

namespace {

constexpr uint64_t kMaxReadGuest = 64ull << 20;

// Calls from thread-safe-function callbacks use the raw N-API and ignore
// failures: while Node tears an environment down it still drains queued
// calls but refuses to run JS, and node-addon-api's wrappers would turn that
// refusal into a fatal error.
void call_quietly(Napi::Env env, Napi::Function fn, napi_value arg) {
  napi_value result;
  if (napi_call_function(env, env.Undefined(), fn, 1, &arg, &result) != napi_ok) {
    bool pending = false;
    napi_is_exception_pending(env, &pending);
    (void)pending;  // a listener's exception stays pending: Node reports it as uncaught
  }
}

// vsockKnockPorts as u32s. lib checked them (lib/vm/machine.ts: 1..1023, at most 16); the vsock
// device asserts the same.
std::vector<uint32_t> parse_knock_ports(const Napi::Value& v) {
  precondition(v.IsArray(), "vsockKnockPorts is an array");
  Napi::Array arr = v.As<Napi::Array>();
  std::vector<uint32_t> ports;
  for (uint32_t i = 0; i < arr.Length(); i++)
    ports.push_back(static_cast<uint32_t>(js::to_uint(unwrap(arr.Get(i)), "vsockKnockPorts[]", 0, 0xffffffffull)));
  return ports;
}

MachineConfig parse_config(const Napi::Value& v) {
  if (!v.IsObject()) throw Error(code::kInvalidArgument, "machine config must be an object");
  Napi::Object o = v.As<Napi::Object>();
  MachineConfig c;
  c.kernel = js::get_string(o, "kernel", true);
  c.initrd = js::get_string(o, "initrd", false);
  c.cmdline = js::get_string(o, "cmdline", false);
  c.vcpus = static_cast<uint32_t>(js::get_uint(o, "vcpus", 1, 254, 2));
  c.memory_mib = js::get_uint(o, "memoryMiB", 2, 1024 * 1024, 512);
  if (js::has(o, "disks")) {
    Napi::Value dv = unwrap(o.Get("disks"));
    if (!dv.IsArray()) throw Error(code::kInvalidArgument, "disks must be an array");
    Napi::Array arr = dv.As<Napi::Array>();
    for (uint32_t i = 0; i < arr.Length(); i++) {
      Napi::Value e = unwrap(arr.Get(i));
      if (!e.IsObject()) throw Error(code::kInvalidArgument, "disks[" + std::to_string(i) + "] must be an object");
      Napi::Object d = e.As<Napi::Object>();
      BlkOptions b;
      b.base_path = js::get_string(d, "base", false);
      b.overlay_path = js::get_string(d, "overlay", false);
      if (b.base_path.empty() && b.overlay_path.empty())
        throw Error(code::kInvalidArgument, "disks[" + std::to_string(i) + "] needs a base or an overlay");
      // Overlays frozen by snapshot generations, oldest first, read-only between the base and
      // the top: booting a paused sandbox's disk as it was at one generation.
      if (js::has(d, "frozen")) {
        Napi::Value fv = unwrap(d.Get("frozen"));
        if (!fv.IsArray()) throw Error(code::kInvalidArgument, "disks[" + std::to_string(i) + "].frozen must be an array");
        Napi::Array fa = fv.As<Napi::Array>();
        if (fa.Length() > 64) throw Error(code::kInvalidArgument, "disks[" + std::to_string(i) + "].frozen: at most 64 layers");
        for (uint32_t j = 0; j < fa.Length(); j++) {
          Napi::Value f = unwrap(fa.Get(j));
          if (!f.IsString() || f.As<Napi::String>().Utf8Value().empty())
            throw Error(code::kInvalidArgument, "disks[" + std::to_string(i) + "].frozen entries must be non-empty strings");
          b.frozen_overlays.push_back(f.As<Napi::String>().Utf8Value());
        }
        if (!b.frozen_overlays.empty() && b.overlay_path.empty())
          throw Error(code::kInvalidArgument, "disks[" + std::to_string(i) + "] with frozen layers needs an overlay (the top)");
      }
      // sizeBytes: the disk's size when it is larger than its layers (a sandbox's disk grown
      // beyond its template's); 0 or absent: the largest layer's.
      b.size_bytes = js::get_uint(d, "sizeBytes", 0, uint64_t{1} << 50, 0);
      b.read_only = js::get_bool(d, "readOnly", false);
      b.serial = js::get_string(d, "serial", false);  // at most 20 bytes: lib checked, the blk factory asserts
      c.disks.push_back(std::move(b));
    }
  }
  // A u32; its range (3..0xfffffffe) is lib's to check, the vsock device's to assert.
  if (js::has(o, "vsockCid")) c.vsock_cid = js::get_uint(o, "vsockCid", 0, 0xffffffffull, std::nullopt);
  if (js::has(o, "vsockKnockPorts")) c.vsock_knock_ports = parse_knock_ports(unwrap(o.Get("vsockKnockPorts")));
  c.rng = js::get_bool(o, "rng", false);
  if (js::has(o, "net")) {
    Napi::Value nv = unwrap(o.Get("net"));
    if (!nv.IsObject()) throw Error(code::kInvalidArgument, "net must be an object");
    Napi::Object n = nv.As<Napi::Object>();
    NetOptions net;
    net.mac = js::get_string(n, "mac", true);
    net.backend_socket = js::get_string(n, "backendSocket", false);
    c.net = std::move(net);
  }
  c.console_log = js::get_string(o, "consoleLog", false);
  c.console_ring_bytes = js::get_uint(o, "consoleRingBytes", 1, 64u << 20, 64 * 1024);
  c.kvm_device = js::get_string(o, "kvmDevice", false, "/dev/kvm");
  return c;
}

}  // namespace

Napi::Function MachineWrap::define(Napi::Env env) {
  return DefineClass(env, "Machine",
                     {
                         InstanceMethod<&MachineWrap::start>("start"),
                         InstanceMethod<&MachineWrap::snapshot>("snapshot"),
                         InstanceMethod<&MachineWrap::capture_now>("captureNow"),
                         InstanceMethod<&MachineWrap::set_teardown_capture>("setTeardownCapture"),
                         InstanceMethod<&MachineWrap::dirty_page_count>("dirtyPageCount"),
                         InstanceMethod<&MachineWrap::prepare_restores>("prepareRestores"),
                         InstanceMethod<&MachineWrap::state_parts>("stateParts"),
                         InstanceMethod<&MachineWrap::dirty_page_bitmap>("dirtyPageBitmap"),
                         InstanceMethod<&MachineWrap::pause>("pause"),
                         InstanceMethod<&MachineWrap::resume>("resume"),
                         InstanceMethod<&MachineWrap::stop>("stop"),
                         InstanceMethod<&MachineWrap::state>("state"),
                         InstanceMethod<&MachineWrap::exit_reason>("exitReason"),
                         InstanceMethod<&MachineWrap::console_write>("consoleWrite"),
                         InstanceMethod<&MachineWrap::console_tail>("consoleTail"),
                         InstanceMethod<&MachineWrap::vsock_connect>("vsockConnect"),
                         InstanceMethod<&MachineWrap::vsock_reset>("vsockReset"),
                         InstanceMethod<&MachineWrap::vsock_knocks>("vsockKnocks"),
                         InstanceMethod<&MachineWrap::set_vsock_knock_ports>("setVsockKnockPorts"),
                         InstanceMethod<&MachineWrap::net_attach>("netAttach"),
                         InstanceMethod<&MachineWrap::net_attach_pair>("netAttachPair"),
                         InstanceMethod<&MachineWrap::net_attach_fd>("netAttachFd"),
                         InstanceMethod<&MachineWrap::net_egress_policy>("netEgressPolicy"),
                         InstanceMethod<&MachineWrap::net_backend_error>("netBackendError"),
                         InstanceMethod<&MachineWrap::read_guest>("readGuest"),
                         InstanceMethod<&MachineWrap::stats>("stats"),
                         InstanceMethod<&MachineWrap::kernel_cmdline>("kernelCmdline"),
                     });
}

MachineWrap::MachineWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<MachineWrap>(info), env_(info.Env()) {
  Napi::Env env = info.Env();
  guarded(env, [&]() -> Napi::Value {
    if (info[0].IsExternal()) {
      // Built on a worker (restoreMachine): adopt it.
      Adopt* a = info[0].As<Napi::External<Adopt>>().Data();
      handle_ = std::move(a->handle);
      bridge_ = std::move(a->bridge);
      machine_ = std::move(a->machine);
      console_ring_bytes_ = machine_->console().capacity();
    } else {
      MachineConfig cfg = parse_config(info[0]);
      if (!info[1].IsFunction()) throw Error(code::kInvalidArgument, "onEvent must be a function");
      console_ring_bytes_ = cfg.console_ring_bytes;
      handle_ = std::make_shared<Handle>();
      bridge_ = std::make_shared<EventBridge>(env, info[1].As<Napi::Function>());
      machine_ = std::make_unique<Machine>(cfg, make_callbacks(bridge_, handle_));
    }
    handle_->wrap = this;
    register_live_machine(machine_.get());
    // After the thread-safe function exists: hooks run last-in first-out.
    if (napi_add_env_cleanup_hook(env, cleanup_hook, this) == napi_ok) hook_registered_ = true;
    return env.Undefined();
  });
}

// One report in flight at most, however often the guest knocks: the JS side
// reads the latched counts when it runs (deliver_knocks).
std::function<void()> MachineWrap::knock_reporter(const std::shared_ptr<EventBridge>& bridge,
                                                  const std::shared_ptr<Handle>& handle) {
  auto posted = std::make_shared<std::atomic<bool>>(false);
  return [bridge, handle, posted] {
    if (posted->exchange(true)) return;
    bool ok = bridge->post([handle, posted](Napi::Env env, Napi::Function fn) {
      posted->store(false);
      if (handle->wrap) handle->wrap->deliver_knocks(env, fn);
    });
    if (!ok) posted->store(false);
  };
}

Machine::Callbacks MachineWrap::make_callbacks(const std::shared_ptr<EventBridge>& bridge,
                                              const std::shared_ptr<Handle>& handle) {
  Machine::Callbacks cb;
  cb.console_pending = [bridge, handle] {
    bridge->post([handle](Napi::Env env, Napi::Function fn) {
      if (handle->wrap) handle->wrap->drain_console(env, fn);
    });
  };
  cb.vsock_knocked = knock_reporter(bridge, handle);
  cb.exited = [bridge, handle](MachineState state, const ExitReason& reason) {
    bridge->post([handle, state, reason](Napi::Env env, Napi::Function fn) {
      if (handle->wrap) handle->wrap->deliver_exit(env, fn, state, reason);
    });
  };
  return cb;
}

namespace {

Napi::Object snapshot_object(Napi::Env env, const CaptureResult& r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("generation", static_cast<double>(r.generation));
  o.Set("bytes", static_cast<double>(r.bytes));
  o.Set("dirtyPages", static_cast<double>(r.dirty_pages));
  o.Set("fullLayer", r.full_layer);
  Napi::Array disks = Napi::Array::New(env, r.disk_layers.size());
  for (uint32_t i = 0; i < r.disk_layers.size(); i++) {
    Napi::Array layers = Napi::Array::New(env, r.disk_layers[i].size());
    for (uint32_t k = 0; k < r.disk_layers[i].size(); k++) layers.Set(k, r.disk_layers[i][k]);
    disks.Set(i, layers);
  }
  o.Set("diskLayers", disks);
  o.Set("stateFile", r.state_file);
  o.Set("memoryLayer", r.memory_layer);
  o.Set("manifest", r.manifest);
  Napi::Array chain = Napi::Array::New(env, r.memory_layers.size());
  for (uint32_t i = 0; i < r.memory_layers.size(); i++) chain.Set(i, r.memory_layers[i]);
  o.Set("memoryLayers", chain);
  o.Set("capturedMs", r.captured_ms);
  o.Set("durableMs", r.durable_ms);
  return o;
}

// Captures a paused machine into a directory (fdatasync included).
class CaptureWorker final : public CodedWorker {
 public:
  CaptureWorker(Napi::Env env, Napi::Object self, MachineWrap* wrap, uint64_t id, std::string dir, bool resume)
      : CodedWorker(env, "torpor.capture"), self_(Napi::Persistent(self)), wrap_(wrap), machine_(wrap->machine_ptr()),
        id_(id), dir_(std::move(dir)), resume_(resume) {}
  void Execute() override {
    bool resumed = false;
    run([&] {
      result_ = machine_->capture(dir_, [&] {
        // Captured: the machine continues while the generation is written.
        resumed = true;
        if (!resume_) return;
        try {
          machine_->resume();
        } catch (...) {
          // Ended meanwhile (the guest, or a stop): nothing to continue.
        }
      });
    });
    if (resume_ && !resumed) {
      try {
        machine_->resume();  // the capture failed before its copy: continue as before
      } catch (...) {
      }
    }
  }
  void OnOK() override {
    Napi::Env env = Env();
    wrap_->settle(env, id_, code_, message_, code_.empty() ? Napi::Value(snapshot_object(env, result_)) : env.Undefined());
  }

 private:
  Napi::ObjectReference self_;  // keeps the wrap (and its machine) alive while the capture runs
  MachineWrap* wrap_;
  Machine* machine_;
  uint64_t id_;
  std::string dir_;
  bool resume_;
  CaptureResult result_;
};

// Builds a machine on the thread pool (Machine::restore, or the constructor
// for build()), then the JS object around it on the JS thread.
class BuildWorker final : public CodedWorker {
 public:
  using Builder = std::function<std::unique_ptr<Machine>(Machine::Callbacks)>;
  BuildWorker(Napi::Env env, Builder build, std::shared_ptr<EventBridge> bridge,
              std::shared_ptr<MachineWrap::Handle> handle, PendingPromise promise)
      : CodedWorker(env, "torpor.build"), build_(std::move(build)), bridge_(std::move(bridge)), handle_(std::move(handle)),
        promise_(promise) {}
  void Execute() override {
    run([&] { machine_ = build_(MachineWrap::make_callbacks(bridge_, handle_)); });
  }
  void OnOK() override {
    Napi::Env env = Env();
    bridge_->release_hold(env);
    if (!code_.empty()) {
      bridge_->close();
      promise_.settle(env, code_, message_);
      return;
    }
    MachineWrap::Adopt adopt{std::move(machine_), bridge_, handle_};
    napi_value obj;
    napi_value arg = Napi::External<MachineWrap::Adopt>::New(env, &adopt);
    napi_value ctor = addon_state(env)->machine_ctor.Value();
    if (napi_new_instance(env, ctor, 1, &arg, &obj) != napi_ok) {
      Napi::Value err = env.GetAndClearPendingException().Value();
      if (adopt.machine) adopt.machine->release(false);
      bridge_->close();
      promise_.reject_with(env, err);
      return;
    }
    promise_.settle(env, "", "", Napi::Value(env, obj));
  }

 private:
  Builder build_;
  std::shared_ptr<EventBridge> bridge_;
  std::shared_ptr<MachineWrap::Handle> handle_;
  PendingPromise promise_;
  std::unique_ptr<Machine> machine_;
};

}  // namespace

Napi::Value MachineWrap::restore_machine(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    if (!info[0].IsString()) throw Error(code::kInvalidArgument, "restoreMachine: dir must be a string");
    if (!info[1].IsFunction()) throw Error(code::kInvalidArgument, "onEvent must be a function");
    std::string dir = info[0].As<Napi::String>().Utf8Value();
    std::string into;
    if (info.Length() > 2 && !info[2].IsUndefined()) {
      if (!info[2].IsString()) throw Error(code::kInvalidArgument, "restoreMachine: into must be a string");
      into = info[2].As<Napi::String>().Utf8Value();
    }
    // diskBytes?: per disk, the size to grow it to (0: as saved); Machine::restore checks them.
    std::vector<uint64_t> disk_bytes;
    if (info.Length() > 3 && !info[3].IsUndefined()) {
      if (!info[3].IsArray()) throw Error(code::kInvalidArgument, "restoreMachine: diskBytes must be an array");
      Napi::Array arr = info[3].As<Napi::Array>();
      if (arr.Length() > 16) throw Error(code::kInvalidArgument, "restoreMachine: diskBytes: at most 16 disks");
      for (uint32_t i = 0; i < arr.Length(); i++)
        disk_bytes.push_back(js::to_uint(unwrap(arr.Get(i)), "diskBytes[]", 0, uint64_t{1} << 50));
    }
    return queue_build(env, info[1].As<Napi::Function>(), [dir, into, disk_bytes](Machine::Callbacks cb) {
      return Machine::restore(dir, std::move(cb), into, disk_bytes);
    });
  });
}

Napi::Value MachineWrap::build_machine(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    MachineConfig cfg = parse_config(info[0]);  // on the JS thread: it reads JS values
    if (!info[1].IsFunction()) throw Error(code::kInvalidArgument, "onEvent must be a function");
    return queue_build(env, info[1].As<Napi::Function>(),
                       [cfg](Machine::Callbacks cb) { return std::make_unique<Machine>(cfg, std::move(cb)); });
  });
}

Napi::Value MachineWrap::queue_build(Napi::Env env, Napi::Function on_event,
                                     std::function<std::unique_ptr<Machine>(Machine::Callbacks)> build) {
  auto bridge = std::make_shared<EventBridge>(env, on_event);
  auto handle = std::make_shared<Handle>();
  auto [pending, promise] = PendingPromise::make(env);
  bridge->hold(env);
  (new BuildWorker(env, std::move(build), bridge, handle, pending))->Queue();
  return promise;
}

Napi::Value MachineWrap::snapshot(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    Machine& m = live_machine();
    if (!info[0].IsString()) throw Error(code::kInvalidArgument, "snapshot: dir must be a string");
    std::string dir = info[0].As<Napi::String>().Utf8Value();
    bool resume = info[1].IsBoolean() && info[1].As<Napi::Boolean>().Value();
    auto [id, promise] = new_promise(env);
    auto bridge = bridge_;
    auto handle = handle_;
    Machine::Done after_pause = [bridge, handle, id, dir, resume](const char* code, const std::string& message) {
      std::string c = code ? code : "";
      bridge->post([handle, id, c, message, dir, resume](Napi::Env env, Napi::Function) {
        if (!handle->wrap) return;
        if (!c.empty())
          handle->wrap->settle(env, id, c, message, env.Undefined());
        else
          handle->wrap->queue_capture(env, id, dir, resume);
      });
    };
    try {
      m.pause(std::move(after_pause));
    } catch (const Error& e) {
      settle(env, id, e.code(), e.what(), env.Undefined());
    }
    return promise;
  });
}

namespace {
// A capture's optional pause bound in ms (default 2 s).
uint64_t capture_timeout_ms(const Napi::Value& v, const char* what) {
  if (!v.IsNumber()) return 2000;
  double t = v.As<Napi::Number>().DoubleValue();
  if (!(t >= 1 && t <= 600000)) throw Error(code::kInvalidArgument, std::string(what) + ": timeoutMs must be in 1..600000");
  return static_cast<uint64_t>(t);
}
}  // namespace

// The process is ending ('exit' handlers run synchronously, the event loop is over): pause and
// capture on this thread. The pause is bounded by timeoutMs (a vCPU that does not park in time:
// TIMEOUT, nothing written); the capture itself is the one snapshot() runs on a worker. The
// pause's completion comes from a vCPU or the I/O thread, never through the JS thread, so
// waiting for it here cannot deadlock; its state is shared so a late completion finds it alive.
Napi::Value MachineWrap::capture_now(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    Machine& m = live_machine();
    if (!info[0].IsString()) throw Error(code::kInvalidArgument, "captureNow: dir must be a string");
    std::string dir = info[0].As<Napi::String>().Utf8Value();
    uint64_t timeout_ms = capture_timeout_ms(info[1], "captureNow");
    return Napi::Number::New(env, static_cast<double>(capture_bounded(m, dir, timeout_ms)));
  });
}

uint64_t MachineWrap::capture_bounded(Machine& m, const std::string& dir, uint64_t timeout_ms) {
  struct Wait {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    const char* code = nullptr;  // one of the static code:: constants
    std::string message;
  };
  auto w = std::make_shared<Wait>();
  m.pause([w](const char* c, const std::string& message) {
    std::lock_guard<std::mutex> lock(w->mu);
    w->done = true;
    w->code = c;
    w->message = message;
    w->cv.notify_all();
  });
  {
    std::unique_lock<std::mutex> lock(w->mu);
    if (!w->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return w->done; }))
      throw Error(code::kTimeout, "captureNow: the machine did not pause within " + std::to_string(timeout_ms) + " ms");
    if (w->code && *w->code) throw Error(w->code, w->message);
  }
  return m.capture(dir).generation;
}

// setTeardownCapture(dir | null, timeoutMs?): a machine still running when its environment ends
// (a worker thread ending or terminated: no JS runs there any more) is captured into `dir` by the
// cleanup hook, bounded like captureNow, before it is stopped. null: no capture (the default;
// a sandbox clears it when it pauses or is killed).
Napi::Value MachineWrap::set_teardown_capture(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    if (info[0].IsNull() || info[0].IsUndefined()) {
      teardown_capture_dir_.clear();
      return env.Undefined();
    }
    if (!info[0].IsString()) throw Error(code::kInvalidArgument, "setTeardownCapture: dir must be a string or null");
    std::string dir = info[0].As<Napi::String>().Utf8Value();
    if (dir.empty()) throw Error(code::kInvalidArgument, "setTeardownCapture: dir must not be empty");
    uint64_t timeout_ms = capture_timeout_ms(info[1], "setTeardownCapture");
    teardown_capture_dir_ = std::move(dir);
    teardown_capture_timeout_ms_ = timeout_ms;
    return env.Undefined();
  });
}

void MachineWrap::queue_capture(Napi::Env env, uint64_t id, const std::string& dir, bool resume) {
  if (torn_down_ || stopping_ || !machine_ || machine_->released()) {
    settle(env, id, code::kInvalidState, "the machine was stopped before its capture", env.Undefined());
    return;
  }
  (new CaptureWorker(env, Value(), this, id, dir, resume))->Queue();
}

Napi::Value MachineWrap::state_parts(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    Napi::Object o = Napi::Object::New(info.Env());
    for (auto& [name, bytes] : live_machine().state_parts())
      o.Set(name, Napi::Buffer<uint8_t>::Copy(info.Env(), bytes.data(), bytes.size()));
    return o;
  });
}

Napi::Value MachineWrap::describe_snapshot(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    if (!info[0].IsString()) throw Error(code::kInvalidArgument, "describeSnapshot: dir must be a string");
    Napi::Object o = Napi::Object::New(info.Env());
    for (auto& [name, bytes] : Machine::snapshot_parts(info[0].As<Napi::String>().Utf8Value()))
      o.Set(name, Napi::Buffer<uint8_t>::Copy(info.Env(), bytes.data(), bytes.size()));
    return o;
  });
}

Napi::Value MachineWrap::dirty_page_bitmap(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    auto bits = live_machine().dirty_page_bitmap();
    return Napi::Buffer<uint8_t>::Copy(info.Env(), reinterpret_cast<const uint8_t*>(bits.data()), bits.size() * 8);
  });
}

Napi::Value MachineWrap::prepare_restores(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    any_machine().prepare_restores(static_cast<size_t>(js::to_uint(info[0], "count", 0, 256)));
    return info.Env().Undefined();
  });
}

Napi::Value MachineWrap::dirty_page_count(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    return Napi::Number::New(info.Env(), static_cast<double>(live_machine().dirty_page_count()));
  });
}

MachineWrap::~MachineWrap() {
  if (handle_) handle_->wrap = nullptr;
  if (hook_registered_) {
    napi_remove_env_cleanup_hook(env_, cleanup_hook, this);
    hook_registered_ = false;
  }
  teardown();
  machine_.reset();
}

void MachineWrap::cleanup_hook(void* arg) {
  auto* self = static_cast<MachineWrap*>(arg);
  self->hook_registered_ = false;
  if (self->handle_) self->handle_->wrap = nullptr;
  // A sandbox's machine still running (docs/architecture.md#durability-and-ownership, worker threads): a bounded capture first, so a
  // later connect continues it from memory. Best effort: a failure leaves the last generation.
  if (!self->teardown_capture_dir_.empty() && !self->torn_down_ && !self->stopping_ && self->machine_ &&
      !self->machine_->released()) {
    try {
      capture_bounded(*self->machine_, self->teardown_capture_dir_, self->teardown_capture_timeout_ms_);
    } catch (...) {
    }
  }
  // The environment ends (worker end, process end): free everything before
  // returning, KVM objects included, and wait for machines released earlier.
  self->teardown(false);
  reap_drain();
}

void MachineWrap::teardown(bool defer_kvm) {
  if (torn_down_) return;
  torn_down_ = true;
  if (machine_) {
    try {
      machine_->release(defer_kvm);  // joins every vCPU thread and the I/O thread, then frees
    } catch (...) {
    }
    unregister_live_machine(machine_.get());
  }
  if (bridge_) bridge_->close();  // only now: no thread can post any more
}

void MachineWrap::close_events() {
  if (bridge_) bridge_->close();
  if (!self_.IsEmpty()) self_.Reset();
}

Machine& MachineWrap::live_machine() {
  if (torn_down_ || !machine_) throw Error(code::kInvalidState, "the machine was torn down");
  if (stopping_) throw Error(code::kInvalidState, "the machine was stopped: its memory, devices and vsock were released");
  if (machine_->released())
    throw Error(code::kInvalidState, "the machine was stopped: its memory, devices and vsock were released");
  return *machine_;
}

Machine& MachineWrap::any_machine() {
  if (!machine_) throw Error(code::kInvalidState, "the machine was torn down");
  return *machine_;
}

std::pair<uint64_t, Napi::Promise> MachineWrap::new_promise(Napi::Env env) {
  auto [pending, promise] = PendingPromise::make(env);
  uint64_t id = next_id_++;
  pending_.emplace(id, pending);
  bridge_->hold(env);
  return {id, promise};
}

void MachineWrap::settle(Napi::Env env, uint64_t id, const std::string& code, const std::string& message,
                         Napi::Value value) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  PendingPromise pending = it->second;
  pending_.erase(it);
  bridge_->release_hold(env);
  pending.settle(env, code, message, value);
}

Machine::Done MachineWrap::completion(uint64_t id) {
  auto bridge = bridge_;
  auto handle = handle_;
  return [bridge, handle, id](const char* code, const std::string& message) {
    std::string c = code ? code : "";
    bridge->post([handle, id, c, message](Napi::Env env, Napi::Function) {
      if (handle->wrap) handle->wrap->settle(env, id, c, message, env.Undefined());
    });
  };
}

Napi::Value MachineWrap::start(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    Machine& m = live_machine();
    bool paused = info[0].IsBoolean() && info[0].As<Napi::Boolean>().Value();
    auto [id, promise] = new_promise(env);
    try {
      m.start(completion(id), paused);
    } catch (const Error& e) {
      settle(env, id, e.code(), e.what(), env.Undefined());
      return promise;
    }
    if (self_.IsEmpty()) self_ = Napi::Persistent(Value());
    return promise;
  });
}

Napi::Value MachineWrap::pause(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    Machine& m = live_machine();
    auto [id, promise] = new_promise(env);
    try {
      m.pause(completion(id));
    } catch (const Error& e) {
      settle(env, id, e.code(), e.what(), env.Undefined());
    }
    return promise;
  });
}

Napi::Value MachineWrap::resume(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    try {
      live_machine().resume();
    } catch (const Error& e) {
      return settled_promise(env, e.code(), e.what());
    }
    return settled_promise(env, "", "");
  });
}

namespace {

// stop() and release() on the thread pool: joining the vCPU and I/O threads,
// closing the devices' files (a disk overlay's final flush) never block JS.
class StopWorker final : public Napi::AsyncWorker {
 public:
  StopWorker(Napi::Env env, Napi::Object self, MachineWrap* wrap, Machine* machine, PendingPromise promise)
      : Napi::AsyncWorker(env, "torpor.stop"), self_(Napi::Persistent(self)), wrap_(wrap), machine_(machine),
        promise_(promise) {}
  void Execute() override {
    try {
      // One call, one hold of the machine's stop lock: stops, then gives back
      // fds, RAM and threads now, not at garbage collection.
      reason_ = machine_->release();
    } catch (const std::exception& e) {
      reason_.kind = "internal-error";
      reason_.message = e.what();
    }
  }
  void OnOK() override {
    // Released: no thread posts events any more (what they posted is still
    // delivered). Closing the bridge drops its reference to the JS listener,
    // and with it the last path that kept this machine's wrapper alive.
    wrap_->close_events();
    Napi::Object o = Napi::Object::New(Env());
    o.Set("kind", reason_.kind);
    o.Set("message", reason_.message);
    o.Set("consoleTail", reason_.console_tail);
    promise_.settle(Env(), "", "", o);
  }

 private:
  Napi::ObjectReference self_;  // keeps the wrap and its machine alive until done
  MachineWrap* wrap_;
  Machine* machine_;
  PendingPromise promise_;
  ExitReason reason_;
};

}  // namespace

Napi::Value MachineWrap::stop(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    if (!machine_ || torn_down_) return settled_promise(env, code::kInvalidState, "the machine was torn down");
    auto [pending, promise] = PendingPromise::make(env);
    // From here the calls that touch guest memory, devices or vsock refuse
    // (INVALID_STATE) while the worker releases them.
    stopping_ = true;
    (new StopWorker(env, Value(), this, machine_.get(), pending))->Queue();
    return promise;
  });
}

Napi::Value MachineWrap::state(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    if (!machine_) return Napi::String::New(info.Env(), "stopped");
    return Napi::String::New(info.Env(), machine_state_name(machine_->state()));
  });
}

Napi::Object MachineWrap::reason_object(Napi::Env env, const ExitReason& r) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("kind", r.kind);
  o.Set("message", r.message);
  o.Set("consoleTail", r.console_tail);
  return o;
}

Napi::Value MachineWrap::exit_reason(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    if (!machine_) return info.Env().Null();
    auto r = machine_->exit_reason();
    if (!r) return info.Env().Null();
    return reason_object(info.Env(), *r);
  });
}

Napi::Value MachineWrap::console_write(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    Machine& m = live_machine();
    size_t taken;
    if (info[0].IsBuffer()) {
      auto b = info[0].As<Napi::Buffer<uint8_t>>();
      taken = m.console_input(b.Data(), b.Length());
    } else if (info[0].IsString()) {
      std::string s = info[0].As<Napi::String>().Utf8Value();
      taken = m.console_input(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    } else {
      throw Error(code::kInvalidArgument, "consoleWrite takes a Buffer or a string");
    }
    return Napi::Number::New(info.Env(), static_cast<double>(taken));
  });
}

Napi::Value MachineWrap::console_tail(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    auto bytes = any_machine().console().tail(console_ring_bytes_);
    return Napi::Buffer<uint8_t>::Copy(info.Env(), bytes.data(), bytes.size());
  });
}

Napi::Value MachineWrap::vsock_connect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  return guarded(env, [&]() -> Napi::Value {
    Machine& m = live_machine();
    uint32_t port = static_cast<uint32_t>(js::to_uint(info[0], "port", 0, 0xffffffffull));
    uint32_t timeout = 5000;
    if (!info[1].IsUndefined()) timeout = static_cast<uint32_t>(js::to_uint(info[1], "timeoutMs", 1, 3600000));
    VsockHost* host = m.vsock();
    if (!host) throw Error(code::kInvalidState, "this machine has no vsock device (set vsockCid)");
    if (m.state() != MachineState::Running && m.state() != MachineState::Pausing && m.state() != MachineState::Paused)
      throw Error(code::kInvalidState, std::string("vsockConnect: machine is ") + machine_state_name(m.state()));
    auto [id, promise] = new_promise(env);
    auto bridge = bridge_;
    auto handle = handle_;
    host->connect(port, timeout, [bridge, handle, id](int fd, const char* code, const std::string& message) {
      std::string c = fd >= 0 ? "" : (code ? code : code::kVsockRefused);
      bool posted = bridge->post([handle, id, fd, c, message](Napi::Env env, Napi::Function) {
        if (!handle->wrap) {
          if (fd >= 0) ::close(fd);
          return;
        }
        handle->wrap->settle(env, id, c, message, Napi::Number::New(env, fd));
      });
      if (!posted && fd >= 0) ::close(fd);
    });
    return promise;
  });
}

Napi::Value MachineWrap::vsock_reset(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    VsockHost* host = live_machine().vsock();
    if (!host) throw Error(code::kInvalidState, "this machine has no vsock device (set vsockCid)");
    host->transport_reset();
    return info.Env().Undefined();
  });
}

// setVsockKnockPorts(ports): a restored machine's knock ports (a snapshot keeps
// none), before start().
Napi::Value MachineWrap::set_vsock_knock_ports(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    std::vector<uint32_t> ports = parse_knock_ports(info[0]);
    Machine& m = live_machine();
    VsockHost* host = m.vsock();
    if (!host) throw Error(code::kInvalidState, "this machine has no vsock device");
    if (m.state() != MachineState::Created)
      throw Error(code::kInvalidState, std::string("setVsockKnockPorts: machine is ") + machine_state_name(m.state()));
    host->set_knock_ports(ports, knock_reporter(bridge_, handle_));
    knocks_delivered_.clear();
    return info.Env().Undefined();
  });
}

// Connects the network device to a backend's Unix socket (a fresh passt after
// a restore). Connecting a Unix socket does not wait on the peer: it is done
// here, on the JS thread.
Napi::Value MachineWrap::net_attach(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    if (!info[0].IsString()) throw Error(code::kInvalidArgument, "netAttach: socket path must be a string");
    live_machine().net_attach(info[0].As<Napi::String>().Utf8Value());
    return info.Env().Undefined();
  });
}

// vsockKnocks(port) -> knocks counted on that knock port (0: none, not a knock
// port, no vsock device, or the machine released).
Napi::Value MachineWrap::vsock_knocks(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    uint32_t port = static_cast<uint32_t>(js::to_uint(info[0], "port", 0, 0xffffffffull));
    VsockHost* host = any_machine().vsock();
    uint64_t count = 0;
    if (host)
      for (auto [p, n] : host->knocks())
        if (p == port) count = n;
    return Napi::Number::New(info.Env(), static_cast<double>(count));
  });
}

// The fd returned is CLOEXEC; child_process maps it onto the child's fd 3
// (dup2 clears the flag there).
Napi::Value MachineWrap::net_attach_pair(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    int fd = live_machine().net_attach_pair();
    remember_net_socket(fd);  // handed to JS: closeNetSocket may close it
    return Napi::Number::New(info.Env(), fd);
  });
}

// netAttachFd(fd): the machine takes the fd (one end of netSocketPair()).
Napi::Value MachineWrap::net_attach_fd(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    int fd = static_cast<int>(js::to_uint(info[0], "fd", 0, 0x7fffffff));
    forget_net_socket(fd);  // the machine owns it from here, even if it refuses it (closed then)
    live_machine().net_attach_fd(fd);
    return info.Env().Undefined();
  });
}

// netEgressPolicy({ egress, guestPorts: number[], allowIpv4: string[] })
Napi::Value MachineWrap::net_egress_policy(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    if (!info[0].IsObject()) throw Error(code::kInvalidArgument, "netEgressPolicy: policy must be an object");
    Napi::Object o = info[0].As<Napi::Object>();
    EgressPolicy p;
    p.egress = js::get_bool(o, "egress", true);
    if (js::has(o, "guestPorts")) {
      Napi::Value v = unwrap(o.Get("guestPorts"));
      if (!v.IsArray()) throw Error(code::kInvalidArgument, "guestPorts must be an array");
      Napi::Array a = v.As<Napi::Array>();
      if (a.Length() > 1024) throw Error(code::kInvalidArgument, "at most 1024 guest ports");
      for (uint32_t i = 0; i < a.Length(); i++)
        p.guest_ports.push_back(static_cast<uint16_t>(js::to_uint(unwrap(a.Get(i)), "guest port", 1, 65535)));
    }
    if (js::has(o, "allowIpv4")) {
      Napi::Value v = unwrap(o.Get("allowIpv4"));
      if (!v.IsArray()) throw Error(code::kInvalidArgument, "allowIpv4 must be an array");
      Napi::Array a = v.As<Napi::Array>();
      if (a.Length() > 64) throw Error(code::kInvalidArgument, "at most 64 allowed addresses");
      for (uint32_t i = 0; i < a.Length(); i++) {
        Napi::Value e = unwrap(a.Get(i));
        if (!e.IsString()) throw Error(code::kInvalidArgument, "allowIpv4 entries must be strings");
        uint32_t addr;
        if (inet_pton(AF_INET, e.As<Napi::String>().Utf8Value().c_str(), &addr) != 1)
          throw Error(code::kInvalidArgument, "allowIpv4 entries must be dotted IPv4 addresses");
        p.allowed_ipv4.push_back(addr);
      }
    }
    live_machine().net_set_egress_policy(std::move(p));
    return info.Env().Undefined();
  });
}

Napi::Value MachineWrap::net_backend_error(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    return Napi::String::New(info.Env(), live_machine().net_backend_error());
  });
}

Napi::Value MachineWrap::read_guest(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    Machine& m = live_machine();
    uint64_t gpa = js::to_uint(info[0], "gpa", 0, (1ull << 53) - 1);
    uint64_t len = js::to_uint(info[1], "length", 0, kMaxReadGuest);
    auto buf = Napi::Buffer<uint8_t>::New(info.Env(), len);
    if (!m.memory().read(gpa, buf.Data(), len))
      throw Error(code::kGuestMemory, "guest-physical range [" + std::to_string(gpa) + ", +" + std::to_string(len) +
                                          ") is not RAM");
    return buf;
  });
}

Napi::Value MachineWrap::stats(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    MachineStats s = any_machine().stats();
    Napi::Object o = Napi::Object::New(info.Env());
    o.Set("exits", static_cast<double>(s.exits));
    o.Set("pioExits", static_cast<double>(s.pio_exits));
    o.Set("mmioExits", static_cast<double>(s.mmio_exits));
    o.Set("haltExits", static_cast<double>(s.halt_exits));
    o.Set("createToFirstRunNs", static_cast<double>(s.create_to_first_run_ns));
    o.Set("createToFirstExitNs", static_cast<double>(s.create_to_first_exit_ns));
    o.Set("firstExitAtNs", Napi::BigInt::New(info.Env(), s.first_exit_at_ns));
    Napi::Object phases = Napi::Object::New(info.Env());
    for (const auto& [name, ms] : s.build_phases) phases.Set(name, ms);
    o.Set("buildPhasesMs", phases);
    if (VsockHost* host = any_machine().vsock()) {
      VsockStats v = host->stats();
      Napi::Object vs = Napi::Object::New(info.Env());
      vs.Set("txPackets", static_cast<double>(v.tx_packets));
      vs.Set("rxPackets", static_cast<double>(v.rx_packets));
      vs.Set("dropped", static_cast<double>(v.dropped));
      vs.Set("rstSent", static_cast<double>(v.rst_sent));
      vs.Set("connections", static_cast<double>(v.connections));
      vs.Set("live", static_cast<double>(v.live));
      vs.Set("events", static_cast<double>(v.events));
      vs.Set("knocks", static_cast<double>(v.knocks));
      vs.Set("heldRequests", static_cast<double>(v.held_requests));
      vs.Set("lastDrop", v.last_drop);
      o.Set("vsock", vs);
    }
    return o;
  });
}

Napi::Value MachineWrap::kernel_cmdline(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    return Napi::String::New(info.Env(), any_machine().kernel_cmdline());
  });
}

void MachineWrap::drain_console(Napi::Env env, Napi::Function on_event) {
  if (!machine_) return;
  auto bytes = machine_->console().take_pending();
  if (bytes.empty()) return;
  Napi::Object ev = Napi::Object::New(env);
  ev.Set("type", "console");
  ev.Set("data", Napi::Buffer<uint8_t>::Copy(env, bytes.data(), bytes.size()));
  call_quietly(env, on_event, ev);
}

void MachineWrap::deliver_knocks(Napi::Env env, Napi::Function on_event) {
  VsockHost* host = machine_ ? machine_->vsock() : nullptr;
  if (!host) return;
  for (auto [port, count] : host->knocks()) {
    uint64_t& seen = knocks_delivered_[port];
    if (count <= seen) continue;
    seen = count;
    Napi::Object ev = Napi::Object::New(env);
    ev.Set("type", "vsockKnock");
    ev.Set("port", static_cast<double>(port));
    ev.Set("count", static_cast<double>(count));
    call_quietly(env, on_event, ev);
  }
}

void MachineWrap::deliver_exit(Napi::Env env, Napi::Function on_event, MachineState state, const ExitReason& reason) {
  drain_console(env, on_event);  // everything printed comes before the exit event
  Napi::Object ev = Napi::Object::New(env);
  ev.Set("type", "exit");
  ev.Set("state", machine_state_name(state));
  ev.Set("reason", reason_object(env, reason));
  if (!self_.IsEmpty()) self_.Reset();  // an ended machine may be collected
  // The guest ended it: reap the vCPU threads now (they have left or are
  // leaving). Guest memory stays readable until stop() releases it.
  if (machine_ && !torn_down_) {
    try {
      machine_->stop();
    } catch (...) {
    }
  }
  call_quietly(env, on_event, ev);
}

}  // namespace torpor
