// torpor::Error: a full disk is OUT_OF_SPACE whichever I/O call found it; errno is kept.
#include <errno.h>

#include <cstring>

#include "common/error.h"
#include "test/check.h"

using namespace torpor;

namespace {
const char* code_of(const char* code, int err) {
  try {
    throw_sys_error(code, "write something", err);
  } catch (const Error& e) {
    CHECK_EQ(e.sys_errno(), err);
    return e.code();
  }
  return "";
}
}  // namespace

TEST("error: IO_ERROR with ENOSPC or EDQUOT is OUT_OF_SPACE; other codes and errnos stay") {
  CHECK(std::strcmp(code_of(code::kIo, ENOSPC), "OUT_OF_SPACE") == 0);
  CHECK(std::strcmp(code_of(code::kIo, EDQUOT), "OUT_OF_SPACE") == 0);
  CHECK(std::strcmp(code_of(code::kIo, EIO), "IO_ERROR") == 0);
  CHECK(std::strcmp(code_of(code::kPermissionDenied, ENOSPC), "PERMISSION_DENIED") == 0);
  CHECK(std::strcmp(Error(code::kIo, "m", ENOSPC).code(), "OUT_OF_SPACE") == 0);
  CHECK(std::strcmp(Error(code::kIo, "m").code(), "IO_ERROR") == 0);
}
