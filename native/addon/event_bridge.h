// Carries work from native threads (vCPU, I/O) to the JS thread of one
// machine through a thread-safe function, always called non-blocking: no
// native thread ever waits on JS.
//
// The function does not keep the event loop alive (unref'd) except while a
// promise is pending (hold()/release_hold(), counted on the JS thread). close()
// releases it; post() after close() (or once the process is exiting) drops
// the work and returns false, so a late event can never touch a finalized
// thread-safe function.
#pragma once

#include "addon/napi_config.h"

#include <functional>
#include <memory>
#include <mutex>

namespace torpor {

class EventBridge {
 public:
  using Work = std::function<void(Napi::Env env, Napi::Function on_event)>;

  EventBridge(Napi::Env env, Napi::Function on_event);
  ~EventBridge();

  bool post(Work work);  // any thread
  void close();          // JS thread; idempotent
  void hold(Napi::Env env);          // JS thread: a promise is pending
  void release_hold(Napi::Env env);  // JS thread: it settled

 private:
  struct Item {
    Work work;
  };
  static void call_js(Napi::Env env, Napi::Function fn, std::nullptr_t*, Item* item);
  using Tsfn = Napi::TypedThreadSafeFunction<std::nullptr_t, Item, &EventBridge::call_js>;

  std::mutex mu_;
  bool open_ = false;
  int holds_ = 0;
  Tsfn tsfn_;
};

}  // namespace torpor
