// node-addon-api in the mode binding.gyp asks for (NODE_ADDON_API_ENABLE_MAYBE):
// no C++ exceptions from N-API wrappers; calls that can run JS return Maybe.
// Our own C++ exceptions (torpor::Error) are caught at every entry point
// (addon_state.h: guarded) and become pending JS exceptions.
#pragma once

#ifndef NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS
#define NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS
#endif
#include <napi.h>
