#include "common/error.h"

#include <cstring>

namespace torpor {

void throw_sys_error(const char* code, const std::string& what, int err) {
  throw Error(code, what + ": " + std::strerror(err), err);
}

void throw_file_error(const std::string& what, int err) {
  const bool denied = err == EACCES || err == EPERM || err == EROFS;
  throw_sys_error(denied ? code::kPermissionDenied : code::kIo, what, err);
}

}  // namespace torpor
