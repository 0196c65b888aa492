// The owner lock: exclusive per open file description, freed when the fd
// closes or its process dies, never inherited across exec, pid readable.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "base/file_lock.h"
#include "common/error.h"
#include "test/check.h"
#include "test/temp_dir.h"

using namespace torpor;

TEST("file lock: a second open of the same path is refused, naming the holder; closing frees it") {
  torpor_test::TempDir dir("file-lock");
  std::string path = dir.file("a.lock");
  FileLockAttempt first = try_lock_file(path);
  CHECK(first.fd.valid());
  CHECK(!first.owner.has_value());
  CHECK(fcntl(first.fd.get(), F_GETFD) & FD_CLOEXEC);
  FileLockAttempt second = try_lock_file(path);
  CHECK(!second.fd.valid());
  CHECK(second.owner.has_value());
  CHECK_EQ(*second.owner, static_cast<long>(getpid()));
  first.fd.reset();
  FileLockAttempt third = try_lock_file(path);
  CHECK(third.fd.valid());
}

TEST("file lock: the lock of a SIGKILLed holder is free at once") {
  torpor_test::TempDir dir("file-lock");
  std::string path = dir.file("b.lock");
  int ready[2];
  CHECK(pipe(ready) == 0);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    FileLockAttempt held = try_lock_file(path);
    char c = held.fd.valid() ? 'y' : 'n';
    (void)!write(ready[1], &c, 1);
    for (;;) pause();
  }
  close(ready[1]);
  char c = 0;
  CHECK_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  CHECK_EQ(c, 'y');
  FileLockAttempt busy = try_lock_file(path);
  CHECK(!busy.fd.valid());
  CHECK_EQ(busy.owner.value_or(-1), static_cast<long>(child));
  kill(child, SIGKILL);
  int status = 0;
  CHECK_EQ(waitpid(child, &status, 0), child);
  FileLockAttempt after = try_lock_file(path);
  CHECK(after.fd.valid());
}

TEST("file lock: the pid is read only when it is one (garbage, empty, huge: unknown)") {
  torpor_test::TempDir dir("file-lock");
  auto owner_of = [&](const std::string& text) {
    std::string path = dir.file("c.lock");
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK(fd >= 0);
    CHECK_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    std::optional<long> pid = read_lock_owner(fd);
    close(fd);
    return pid.value_or(-1);
  };
  CHECK_EQ(owner_of("1234\n"), 1234L);
  CHECK_EQ(owner_of("1234\n99\n"), 1234L);  // a longer old pid's tail, mid-rewrite
  CHECK_EQ(owner_of(""), -1L);
  CHECK_EQ(owner_of("1234"), -1L);
  CHECK_EQ(owner_of("abc\n"), -1L);
  CHECK_EQ(owner_of("0\n"), -1L);
  CHECK_EQ(owner_of("99999999999999999999\n"), -1L);
}

TEST("file lock: an unusable path is a typed error with errno") {
  torpor_test::TempDir dir("file-lock");
  try {
    (void)try_lock_file(dir.file("missing-dir/d.lock"));
    CHECK(false);
  } catch (const Error& e) {
    CHECK_STR_EQ(e.code(), "IO_ERROR");
    CHECK_EQ(e.sys_errno(), ENOENT);
  }
}
