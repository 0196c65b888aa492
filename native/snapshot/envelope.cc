#include "snapshot/envelope.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "base/fd.h"
#include "base/file_io.h"
#include "snapshot/crc32c.h"

namespace torpor {
namespace {

// Fixed header (docs/snapshot.md): magic, version, flags, fingerprint length,
// reserved, body length. Then fingerprint, body, CRC-32C.
constexpr size_t kHeaderBytes = 32;
constexpr size_t kChecksumBytes = 4;
constexpr uint32_t kMaxFingerprintBytes = 4096;

[[noreturn]] void invalid(const std::string& why) {
  throw Error(code::kSnapshotInvalid, "state file is not a valid torpor snapshot: " + why);
}

uint32_t le32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}


}  // namespace

std::vector<uint8_t> encode_state_file(const HostFingerprint& fp, const std::vector<uint8_t>& body) {
  StateWriter fpw;
  write_fingerprint(fpw, fp);
  const std::vector<uint8_t>& fpb = fpw.data();
  if (fpb.size() > kMaxFingerprintBytes)
    throw Error(code::kInvalidArgument, "host fingerprint too large for a state file");
  if (body.size() > kMaxStateFileBytes - kHeaderBytes - kChecksumBytes - fpb.size())
    throw Error(code::kInvalidArgument, "machine state of " + std::to_string(body.size()) +
                                            " bytes exceeds the state file cap of " +
                                            std::to_string(kMaxStateFileBytes) + " bytes");
  StateWriter w;
  w.raw(kStateMagic, sizeof kStateMagic);
  w.u32(kStateFormatVersion);
  w.u32(0);  // flags: none defined in version 1
  w.u32(static_cast<uint32_t>(fpb.size()));
  w.u32(0);  // reserved
  w.u64(body.size());
  w.raw(fpb.data(), fpb.size());
  w.raw(body.data(), body.size());
  w.u32(crc32c(w.data().data(), w.data().size()));
  return w.take();
}

std::vector<uint8_t> parse_state_file(const uint8_t* data, size_t size, const HostFingerprint& here) {
  // 1. size
  if (size < kHeaderBytes + kChecksumBytes)
    invalid("file is truncated (" + std::to_string(size) + " bytes, less than a header)");
  if (size > kMaxStateFileBytes)
    invalid("file of " + std::to_string(size) + " bytes exceeds the cap of " + std::to_string(kMaxStateFileBytes));
  // 2. magic
  if (std::memcmp(data, kStateMagic, sizeof kStateMagic) != 0) invalid("bad magic (not a torpor state file)");
  // 3. version
  uint32_t version = le32(data + 8);
  if (version != kStateFormatVersion)
    invalid("format version " + std::to_string(version) + ", this build reads version " +
            std::to_string(kStateFormatVersion));
  uint32_t flags = le32(data + 12);
  if (flags != 0) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%#x", flags);
    invalid(std::string("unknown flags ") + hex);
  }
  // 4. lengths
  uint32_t fp_bytes = le32(data + 16);
  uint32_t reserved = le32(data + 20);
  uint64_t body_bytes = le64(data + 24);
  if (reserved != 0) invalid("reserved header field is not zero");
  if (fp_bytes > kMaxFingerprintBytes) invalid("fingerprint length " + std::to_string(fp_bytes) + " is too large");
  uint64_t room = size - kHeaderBytes - kChecksumBytes;
  if (fp_bytes > room || body_bytes != room - fp_bytes)
    invalid("lengths in the header (fingerprint " + std::to_string(fp_bytes) + ", body " +
            std::to_string(body_bytes) + ") do not match the file size " + std::to_string(size) +
            " (truncated or extended)");
  // 5. checksum
  size_t covered = size - kChecksumBytes;
  uint32_t want = le32(data + covered);
  uint32_t got = crc32c(data, covered);
  if (want != got) invalid("checksum mismatch (file is corrupt)");
  // 6. fingerprint
  StateReader fpr(data + kHeaderBytes, fp_bytes);
  HostFingerprint saved = read_fingerprint(fpr);
  fpr.expect_end();
  check_compatible(saved, here);
  const uint8_t* body = data + kHeaderBytes + fp_bytes;
  return std::vector<uint8_t>(body, body + body_bytes);
}

std::vector<uint8_t> read_state_file(const std::string& path, const HostFingerprint& here) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.get() < 0) throw_sys_error(code::kIo, "open state file " + path);
  struct stat st;
  if (::fstat(f.get(), &st) != 0) throw_sys_error(code::kIo, "stat state file " + path);
  if (!S_ISREG(st.st_mode)) invalid(path + " is not a regular file");
  // The cap is checked before reading so a huge file costs nothing.
  if (static_cast<uint64_t>(st.st_size) > kMaxStateFileBytes)
    invalid(path + " is " + std::to_string(st.st_size) + " bytes, over the cap of " +
            std::to_string(kMaxStateFileBytes));
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  long long n = file_io::pread_upto(f.get(), bytes.data(), bytes.size(), 0);
  if (n < 0) throw_sys_error(code::kIo, "read state file " + path, static_cast<int>(-n));
  bytes.resize(static_cast<size_t>(n));  // shorter if it shrank meanwhile: the size check refuses it
  return parse_state_file(bytes.data(), bytes.size(), here);
}

void write_state_file(const std::string& path, const HostFingerprint& fp, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> bytes = encode_state_file(fp, body);
  Fd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (f.get() < 0) throw_sys_error(code::kIo, "create state file " + path);
  if (int rc = file_io::pwrite_all(f.get(), bytes.data(), bytes.size(), 0); rc < 0)
    throw_sys_error(code::kIo, "write state file " + path, -rc);
  if (::fsync(f.get()) != 0) throw_sys_error(code::kIo, "fsync state file " + path);
}

}  // namespace torpor
