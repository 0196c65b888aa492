// QEMU's stream network protocol, as passt speaks it on its Unix socket:
// each Ethernet frame is preceded by its length as a 4-byte big-endian
// integer. Parsing is separate from the socket so it is tested and fuzzed
// on its own.
#pragma once

#include <cstddef>
#include <cstdint>

namespace torpor::net_stream {

inline constexpr size_t kLengthBytes = 4;

enum class Parse { kNeedMore, kFrame, kBad };

// Looks at the start of `buf` (`n` bytes). kFrame: a whole frame of *len
// bytes starts at buf + kLengthBytes. kBad: a length of 0 or above max_len
// (the peer is broken or hostile: the stream cannot be resynchronised).
inline Parse next_frame(const uint8_t* buf, size_t n, size_t max_len, size_t* len) {
  if (n < kLengthBytes) return Parse::kNeedMore;
  size_t l = (size_t{buf[0]} << 24) | (size_t{buf[1]} << 16) | (size_t{buf[2]} << 8) | size_t{buf[3]};
  if (l == 0 || l > max_len) return Parse::kBad;
  if (n - kLengthBytes < l) return Parse::kNeedMore;
  *len = l;
  return Parse::kFrame;
}

inline void put_length(uint8_t* out, uint32_t len) {
  out[0] = static_cast<uint8_t>(len >> 24);
  out[1] = static_cast<uint8_t>(len >> 16);
  out[2] = static_cast<uint8_t>(len >> 8);
  out[3] = static_cast<uint8_t>(len);
}

}  // namespace torpor::net_stream
