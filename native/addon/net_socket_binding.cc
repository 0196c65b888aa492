#include "addon/net_socket_binding.h"

#include <mutex>
#include <unordered_set>

#include "addon/addon_state.h"
#include "addon/addon_state_inl.h"
#include "common/error.h"
#include "base/fd.h"
#include "devices/virtio/net/make_net.h"

namespace torpor {

namespace {

std::mutex g_mu;
// Never destroyed: a worker's teardown may still close one while the process exits.
std::unordered_set<int>* g_handed_out = new std::unordered_set<int>();

}  // namespace

void remember_net_socket(int fd) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_handed_out->insert(fd);
}

void forget_net_socket(int fd) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_handed_out->erase(fd);
}

// netSocketPair() -> [fd, fd]: a connected stream socket pair (CLOEXEC) for a
// machine's network device (netAttachFd) and its backend process.
Napi::Value net_socket_pair_binding(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    auto [a, b] = make_stream_pair();
    Napi::Array out = Napi::Array::New(info.Env(), 2);
    std::lock_guard<std::mutex> lock(g_mu);
    g_handed_out->insert(a.get());
    g_handed_out->insert(b.get());
    out.Set(uint32_t{0}, Napi::Number::New(info.Env(), a.release()));
    out.Set(uint32_t{1}, Napi::Number::New(info.Env(), b.release()));
    return out;
  });
}

// closeNetSocket(fd): closes an fd netSocketPair handed out and no machine took.
// INVALID_ARGUMENT for any other fd.
Napi::Value close_net_socket_binding(const Napi::CallbackInfo& info) {
  return guarded(info.Env(), [&]() -> Napi::Value {
    if (!info[0].IsNumber()) throw Error(code::kInvalidArgument, "closeNetSocket: fd must be a number");
    int fd = info[0].As<Napi::Number>().Int32Value();
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (!g_handed_out->erase(fd)) throw Error(code::kInvalidArgument, "closeNetSocket: not an open netSocketPair fd");
    }
    Fd closing(fd);
    return info.Env().Undefined();
  });
}

}  // namespace torpor
