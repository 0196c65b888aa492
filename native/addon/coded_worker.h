// A blocking call on libuv's thread pool that keeps its error's code and errno
// (Napi::AsyncWorker's own error path keeps only the message). run() catches
// everything: nothing thrown in Execute crosses into N-API.
#pragma once

#include "addon/napi_config.h"

#include <exception>
#include <string>

#include "common/error.h"

namespace torpor {

class CodedWorker : public Napi::AsyncWorker {
 protected:
  using Napi::AsyncWorker::AsyncWorker;
  template <typename F>
  void run(F&& f) {
    try {
      f();
    } catch (const Error& e) {
      code_ = e.code();
      message_ = e.what();
      errno_ = e.sys_errno();
    } catch (const std::exception& e) {
      code_ = code::kInternal;
      message_ = e.what();
    } catch (...) {
      code_ = code::kInternal;
      message_ = "unknown native error";
    }
  }
  std::string code_, message_;  // code_ empty: the call succeeded
  int errno_ = 0;
};

}  // namespace torpor
