#include "addon/file_binding.h"

#include <string>
#include <utility>

#include "addon/addon_state.h"
#include "addon/coded_worker.h"
#include "addon/promise.h"
#include "base/durable_file.h"
#include "common/error.h"

namespace torpor {

namespace {

class ReplaceFileWorker final : public CodedWorker {
 public:
  ReplaceFileWorker(Napi::Env env, PendingPromise promise, std::string tmp, std::string path, std::string data)
      : CodedWorker(env, "torpor.replaceFile"), promise_(promise), tmp_(std::move(tmp)), path_(std::move(path)),
        data_(std::move(data)) {}
  void Execute() override {
    run([&] { replace_file_durably(tmp_, path_, data_); });
  }
  void OnOK() override {
    Napi::Env env = Env();
    if (code_.empty()) promise_.settle(env, "", "");
    else promise_.reject_with(env, make_js_error(env, code_.c_str(), message_, errno_).Value());
  }

 private:
  PendingPromise promise_;
  std::string tmp_, path_, data_;
};

std::string path_arg(const Napi::CallbackInfo& info, size_t i, const char* name) {
  if (!info[i].IsString()) throw Error(code::kInvalidArgument, std::string("replaceFileDurably: ") + name + " must be a string");
  std::string s = info[i].As<Napi::String>().Utf8Value();
  if (s.empty() || s.find('\0') != std::string::npos)
    throw Error(code::kInvalidArgument, std::string("replaceFileDurably: ") + name + " must be non-empty, without NUL");
  return s;
}

}  // namespace

// replaceFileDurably(tmp, path, text) -> Promise<void>; rejects with PERMISSION_DENIED,
// OUT_OF_SPACE or IO_ERROR (errno kept), as replace_file_durably says; INVALID_ARGUMENT for
// arguments that are not non-empty strings.
Napi::Value replace_file_durably_binding(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  try {
    std::string tmp = path_arg(info, 0, "tmp");
    std::string path = path_arg(info, 1, "path");
    if (!info[2].IsString()) throw Error(code::kInvalidArgument, "replaceFileDurably: text must be a string");
    std::string data = info[2].As<Napi::String>().Utf8Value();
    auto [pending, promise] = PendingPromise::make(env);
    auto* worker = new ReplaceFileWorker(env, pending, std::move(tmp), std::move(path), std::move(data));
    worker->Queue();  // deletes itself once OnOK has run
    return promise;
  } catch (const Error& e) {
    return settled_promise(env, e.code(), e.what());
  } catch (const std::exception& e) {  // std::bad_alloc copying the arguments
    return settled_promise(env, code::kInternal, e.what());
  } catch (...) {
    return settled_promise(env, code::kInternal, "replaceFileDurably: unknown error");
  }
}

}  // namespace torpor
