// The native Machine class (lib/native-types.ts NativeMachine) over vmm/Machine.
//
// Lifetime: while a machine runs, the JS object is kept alive by a strong
// reference of its own (a running VM is not garbage), released at its exit
// event. An env cleanup hook, registered after the thread-safe function so
// that it runs before Node finalizes it, captures the machine when JS asked for
// it (setTeardownCapture: a sandbox's machine), stops it, joins its
// threads and only then releases the thread-safe function (worker exit,
// normal process end). process.exit() is covered by addon_state's atexit.
#pragma once

#include "addon/napi_config.h"

#include <functional>
#include <map>
#include <memory>
#include <unordered_map>

#include "addon/event_bridge.h"
#include "addon/promise.h"
#include "vmm/machine.h"

namespace torpor {

class MachineWrap : public Napi::ObjectWrap<MachineWrap> {
 public:
  static Napi::Function define(Napi::Env env);
  explicit MachineWrap(const Napi::CallbackInfo& info);
  ~MachineWrap() override;

  // restoreMachine(dir, onEvent, into?, diskBytes?): Machine::restore on a worker thread, then
  // a MachineWrap adopting the result on the JS thread.
  static Napi::Value restore_machine(const Napi::CallbackInfo& info);
  // buildMachine(config, onEvent): the constructor's work (VM, RAM, devices,
  // kernel load) on a worker thread.
  static Napi::Value build_machine(const Napi::CallbackInfo& info);
  static Napi::Value queue_build(Napi::Env env, Napi::Function on_event,
                                 std::function<std::unique_ptr<Machine>(Machine::Callbacks)> build);
  // describeSnapshot(dir): the saved state by part (diagnostics and tests).
  static Napi::Value describe_snapshot(const Napi::CallbackInfo& info);

  struct Handle {
    MachineWrap* wrap = nullptr;  // touched on the JS thread only
  };
  // What a MachineWrap built around an existing machine adopts (passed as an External).
  struct Adopt {
    std::unique_ptr<Machine> machine;
    std::shared_ptr<EventBridge> bridge;
    std::shared_ptr<Handle> handle;
  };
  static Machine::Callbacks make_callbacks(const std::shared_ptr<EventBridge>& bridge,
                                           const std::shared_ptr<Handle>& handle);
  // Machine::Callbacks::vsock_knocked: a 'vsockKnock' report to JS, one in flight at most.
  static std::function<void()> knock_reporter(const std::shared_ptr<EventBridge>& bridge,
                                              const std::shared_ptr<Handle>& handle);
  Machine* machine_ptr() { return machine_.get(); }
  // After a stop released the machine: no more events; the wrapper may be collected.
  void close_events();
  void settle(Napi::Env env, uint64_t id, const std::string& code, const std::string& message, Napi::Value value);

 private:

  Napi::Value start(const Napi::CallbackInfo& info);
  Napi::Value snapshot(const Napi::CallbackInfo& info);
  Napi::Value capture_now(const Napi::CallbackInfo& info);
  Napi::Value set_teardown_capture(const Napi::CallbackInfo& info);
  // Pauses (bounded by timeout_ms: TIMEOUT, nothing written) and captures a generation into
  // dir on the calling thread; returns the generation. captureNow's and the cleanup hook's work.
  static uint64_t capture_bounded(Machine& m, const std::string& dir, uint64_t timeout_ms);
  Napi::Value dirty_page_count(const Napi::CallbackInfo& info);
  Napi::Value prepare_restores(const Napi::CallbackInfo& info);
  Napi::Value state_parts(const Napi::CallbackInfo& info);
  Napi::Value dirty_page_bitmap(const Napi::CallbackInfo& info);
  void queue_capture(Napi::Env env, uint64_t id, const std::string& dir, bool resume);
  Napi::Value pause(const Napi::CallbackInfo& info);
  Napi::Value resume(const Napi::CallbackInfo& info);
  Napi::Value stop(const Napi::CallbackInfo& info);
  Napi::Value state(const Napi::CallbackInfo& info);
  Napi::Value exit_reason(const Napi::CallbackInfo& info);
  Napi::Value console_write(const Napi::CallbackInfo& info);
  Napi::Value console_tail(const Napi::CallbackInfo& info);
  Napi::Value vsock_connect(const Napi::CallbackInfo& info);
  Napi::Value vsock_reset(const Napi::CallbackInfo& info);
  Napi::Value vsock_knocks(const Napi::CallbackInfo& info);
  Napi::Value set_vsock_knock_ports(const Napi::CallbackInfo& info);
  Napi::Value net_attach(const Napi::CallbackInfo& info);
  Napi::Value net_attach_pair(const Napi::CallbackInfo& info);
  Napi::Value net_attach_fd(const Napi::CallbackInfo& info);
  Napi::Value net_egress_policy(const Napi::CallbackInfo& info);
  Napi::Value net_backend_error(const Napi::CallbackInfo& info);
  Napi::Value read_guest(const Napi::CallbackInfo& info);
  Napi::Value stats(const Napi::CallbackInfo& info);
  Napi::Value kernel_cmdline(const Napi::CallbackInfo& info);

  Machine& live_machine();  // throws INVALID_STATE after teardown or release
  Machine& any_machine();   // also a released machine (state, console tail, stats)
  std::pair<uint64_t, Napi::Promise> new_promise(Napi::Env env);
  Machine::Done completion(uint64_t id);
  void drain_console(Napi::Env env, Napi::Function on_event);
  void deliver_knocks(Napi::Env env, Napi::Function on_event);
  void deliver_exit(Napi::Env env, Napi::Function on_event, MachineState state, const ExitReason& reason);
  static Napi::Object reason_object(Napi::Env env, const ExitReason& r);

  static void cleanup_hook(void* arg);
  void teardown(bool defer_kvm = true);

  napi_env env_;
  std::shared_ptr<Handle> handle_;
  std::shared_ptr<EventBridge> bridge_;
  std::unique_ptr<Machine> machine_;
  std::unordered_map<uint64_t, PendingPromise> pending_;
  uint64_t next_id_ = 1;
  Napi::ObjectReference self_;
  size_t console_ring_bytes_ = 64 * 1024;
  std::map<uint32_t, uint64_t> knocks_delivered_;  // vsockKnock events sent, by port (JS thread)
  bool hook_registered_ = false;
  bool torn_down_ = false;
  bool stopping_ = false;  // stop() was called: the worker releases the machine
  // setTeardownCapture: where the cleanup hook captures a machine still running when its
  // environment ends (a worker thread ending or terminated); empty: no capture.
  std::string teardown_capture_dir_;
  uint64_t teardown_capture_timeout_ms_ = 2000;
};

}  // namespace torpor
