#include "common/error.h"

#include <cstring>

namespace torpor {

void throw_sys_error(const char* code, const std::string& what, int err) {
  throw Error(code, what + ": " + std::strerror(err), err);
}

}  // namespace torpor
