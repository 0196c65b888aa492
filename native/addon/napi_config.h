// node-addon-api in the mode binding.gyp asks for (NODE_ADDON_API_ENABLE_MAYBE):
// no C++ exceptions from N-API wrappers; calls that can run JS return Maybe.
// Our own C++ exceptions (torpor::Error) are caught at every entry point
// (addon_state.h: guarded) and become pending JS exceptions.
#pragma once

#ifndef NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS
#define NODE_ADDON_API_DISABLE_CPP_EXCEPTIONS
#endif
// A worker_threads Worker being terminated still runs the completions of its
// thread-pool work, with JS refused: without this, node-addon-api turns an
// error it cannot throw there (a failed write's rejection being built) into a
// fatal error, an abort of the whole process. With it, the error is dropped
// with the environment that would have seen it.
#ifndef NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS
#define NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS
#endif
#include <napi.h>
