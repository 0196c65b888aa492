// netSocketPair() / closeNetSocket(fd): the socket pairs between a machine's
// network device and its backend process. The fds handed to JS are recorded,
// so closeNetSocket closes only one of them (never an fd someone else opened),
// and a machine that takes one (netAttachFd) takes it off the record.
// Closed here rather than with fs.closeSync: in a worker thread Node warns
// about every fd its fs module did not open itself.
#pragma once

#include "addon/napi_config.h"

namespace torpor {

Napi::Value net_socket_pair_binding(const Napi::CallbackInfo& info);
Napi::Value close_net_socket_binding(const Napi::CallbackInfo& info);
// The machine owns `fd` from now on: closeNetSocket no longer takes it.
void forget_net_socket(int fd);
// An fd handed to JS by other means (Machine.netAttachPair): closeNetSocket takes it.
void remember_net_socket(int fd);

}  // namespace torpor
