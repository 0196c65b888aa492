// Plain-data state encoding for device and vCPU save/restore.
//
// Every device writes its state with StateWriter and reads it back with
// StateReader. The reader treats its input as untrusted: every read is
// bounds-checked and a short or malformed blob throws Error(SNAPSHOT_INVALID)
// instead of reading past the end. Each device prefixes its blob with its own
// tag and version (begin/expect_header) so a blob for another device or
// another layout is refused up front.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/error.h"

namespace torpor {

class StateWriter {
 public:
  void header(std::string_view tag, uint32_t version) {
    str(tag);
    u32(version);
  }
  void u8(uint8_t v) { raw(&v, 1); }
  void u16(uint16_t v) { raw(&v, 2); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void boolean(bool v) { u8(v ? 1 : 0); }
  void str(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    raw(s.data(), s.size());
  }
  void bytes(const void* p, size_t n) {
    u32(static_cast<uint32_t>(n));
    raw(p, n);
  }
  template <typename T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes(&v, sizeof(T));
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  const std::vector<uint8_t>& data() const { return buf_; }
  std::vector<uint8_t> take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

class StateReader {
 public:
  StateReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  explicit StateReader(const std::vector<uint8_t>& v) : StateReader(v.data(), v.size()) {}

  // Checks the tag and returns the version; throws unless tag matches and
  // version is in [min_version, max_version].
  uint32_t expect_header(std::string_view tag, uint32_t min_version, uint32_t max_version) {
    std::string t = str(64);
    if (t != tag) fail("expected state for '" + std::string(tag) + "', found '" + t + "'");
    uint32_t v = u32();
    if (v < min_version || v > max_version)
      fail("unsupported version " + std::to_string(v) + " of '" + std::string(tag) + "'");
    return v;
  }
  uint8_t u8() { uint8_t v; raw(&v, 1); return v; }
  uint16_t u16() { uint16_t v; raw(&v, 2); return v; }
  uint32_t u32() { uint32_t v; raw(&v, 4); return v; }
  uint64_t u64() { uint64_t v; raw(&v, 8); return v; }
  bool boolean() {
    uint8_t v = u8();
    if (v > 1) fail("bad boolean");
    return v == 1;
  }
  std::string str(size_t max_len) {
    uint32_t n = u32();
    if (n > max_len || n > remaining()) fail("string too long");
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  std::vector<uint8_t> bytes(size_t max_len) {
    uint32_t n = u32();
    if (n > max_len || n > remaining()) fail("byte field too long");
    std::vector<uint8_t> v(p_, p_ + n);
    p_ += n;
    return v;
  }
  template <typename T>
  T pod() {
    static_assert(std::is_trivially_copyable_v<T>);
    uint32_t n = u32();
    if (n != sizeof(T)) fail("field has the wrong size");
    T v;
    raw(&v, sizeof(T));
    return v;
  }
  void raw(void* dst, size_t n) {
    if (n > remaining()) fail("state is truncated");
    std::memcpy(dst, p_, n);
    p_ += n;
  }
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  void expect_end() {
    if (remaining() != 0) fail("trailing bytes after state");
  }
  [[noreturn]] static void fail(const std::string& why) { throw Error(code::kSnapshotInvalid, why); }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace torpor
