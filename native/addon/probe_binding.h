// probe(devicePath?): the host probe as a plain JS object (HostProbe).
#pragma once

#include "addon/napi_config.h"

namespace torpor {
Napi::Value probe_binding(const Napi::CallbackInfo& info);
}
