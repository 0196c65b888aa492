#include "base/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "base/fd.h"
#include "base/file_io.h"
#include "common/error.h"

namespace torpor {

namespace {

[[noreturn]] void fail(const char* what, const std::string& path, int err) {
  throw_file_error(std::string("cannot ") + what + " " + path, err);
}

}  // namespace

void replace_file_durably(const std::string& tmp, const std::string& path, std::string_view data) {
  precondition(file_io::parent_dir(tmp) == file_io::parent_dir(path), "replace_file_durably: tmp beside path");
  {
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, 0666));
    if (!fd.valid()) fail("create", tmp, errno);
    try {
      if (int rc = file_io::pwrite_all(fd.get(), data.data(), data.size(), 0); rc < 0) fail("write", tmp, -rc);
      if (::fsync(fd.get()) != 0) fail("sync", tmp, errno);
      // close(2) can report a write-back error on some filesystems: the data would not be safe
      if (::close(fd.release()) != 0) fail("close", tmp, errno);
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail("rename into", path, err);
  }
  if (int rc = file_io::fsync_parent_dir(path.c_str()); rc < 0) fail("sync the directory of", path, -rc);
}

}  // namespace torpor
