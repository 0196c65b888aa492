// Whole-buffer positional file I/O (disk layers, snapshot files, durable
// small files): loops over short transfers and EINTR, returns 0 or -errno,
// never throws.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <string>

namespace torpor::file_io {

// Reads up to len bytes at off; stops early only at end of file. Returns the
// number of bytes read, or -errno.
long long pread_upto(int fd, void* buf, size_t len, uint64_t off);
// Reads exactly len bytes at off: -EIO when the file ends first.
int pread_all(int fd, void* buf, size_t len, uint64_t off);
int pwrite_all(int fd, const void* buf, size_t len, uint64_t off);
// The directory holding `path`: "." for a bare name, "/" for one at the root.
std::string parent_dir(const std::string& path);
// fsync of the directory holding `path`, so a file created there survives a crash.
int fsync_parent_dir(const char* path);

}  // namespace torpor::file_io
