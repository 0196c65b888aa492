#include "errors.h"

#include <errno.h>
#include <stdio.h>

const char *errno_name(int err) {
  switch (err) {
#define N(e) \
  case e:    \
    return #e;
    N(EPERM) N(ENOENT) N(ESRCH) N(EINTR) N(EIO) N(ENXIO) N(E2BIG) N(ENOEXEC) N(EBADF) N(ECHILD)
    N(EAGAIN) N(ENOMEM) N(EACCES) N(EFAULT) N(EBUSY) N(EEXIST) N(EXDEV) N(ENODEV) N(ENOTDIR)
    N(EISDIR) N(EINVAL) N(ENFILE) N(EMFILE) N(ENOTTY) N(ETXTBSY) N(EFBIG) N(ENOSPC) N(ESPIPE)
    N(EROFS) N(EMLINK) N(EPIPE) N(ERANGE) N(ENAMETOOLONG) N(ENOSYS) N(ENOTEMPTY) N(ELOOP)
    N(EDQUOT) N(EOVERFLOW) N(ENOTSUP) N(ECONNRESET) N(ETIMEDOUT)
#undef N
    default: {
      static char buf[16];
      snprintf(buf, sizeof buf, "E%d", err);
      return buf;
    }
  }
}

const char *errno_code(int err) {
  switch (err) {
    case ENOENT: return CODE_FILE_NOT_FOUND;
    case EACCES: case EPERM: return CODE_PERMISSION_DENIED;
    case EEXIST: return CODE_FILE_EXISTS;
    case ENOTDIR: return CODE_NOT_A_DIRECTORY;
    case EISDIR: return CODE_IS_A_DIRECTORY;
    case ENOTEMPTY: return CODE_NOT_EMPTY;
    case ENOSPC: case EDQUOT: return CODE_OUT_OF_SPACE;
    case EINVAL: case ENAMETOOLONG: return CODE_INVALID_ARGUMENT;
    case ESRCH: return CODE_PROCESS_NOT_FOUND;
    default: return CODE_REQUEST_FAILED;
  }
}
