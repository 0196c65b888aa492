#include "snapshot/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace torpor {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

// tables[k][b]: the CRC of byte b followed by k zero bytes (slicing-by-8).
constexpr std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t b = 0; b < 256; b++) {
    uint32_t c = b;
    for (int i = 0; i < 8; i++) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
    t[0][b] = c;
  }
  for (int k = 1; k < 8; k++)
    for (uint32_t b = 0; b < 256; b++) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
  return t;
}
constexpr auto kTables = make_tables();

// Raw update: no initial/final inversion.
uint32_t update_table(uint32_t crc, const uint8_t* p, size_t n) {
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian host (x86-64, aarch64)
    w ^= crc;
    crc = kTables[7][w & 0xFF] ^ kTables[6][(w >> 8) & 0xFF] ^ kTables[5][(w >> 16) & 0xFF] ^
          kTables[4][(w >> 24) & 0xFF] ^ kTables[3][(w >> 32) & 0xFF] ^ kTables[2][(w >> 40) & 0xFF] ^
          kTables[1][(w >> 48) & 0xFF] ^ kTables[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ kTables[0][(crc ^ *p++) & 0xFF];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t update_hw(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

// Four independent pages per loop: crc32 has a 3-cycle latency and a
// 1-cycle throughput, so one stream leaves the unit two thirds idle.
__attribute__((target("sse4.2"))) void pages_hw(const uint8_t* const* pages, size_t n, size_t bytes,
                                                 uint32_t* out) {
  size_t i = 0;
  if (bytes % 8 == 0) {
    for (; i + 4 <= n; i += 4) {
      uint64_t c0 = 0xFFFFFFFFu, c1 = c0, c2 = c0, c3 = c0;
      const uint8_t *p0 = pages[i], *p1 = pages[i + 1], *p2 = pages[i + 2], *p3 = pages[i + 3];
      for (size_t off = 0; off < bytes; off += 8) {
        uint64_t w0, w1, w2, w3;
        std::memcpy(&w0, p0 + off, 8);
        std::memcpy(&w1, p1 + off, 8);
        std::memcpy(&w2, p2 + off, 8);
        std::memcpy(&w3, p3 + off, 8);
        c0 = _mm_crc32_u64(c0, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
        c3 = _mm_crc32_u64(c3, w3);
      }
      out[i] = ~static_cast<uint32_t>(c0);
      out[i + 1] = ~static_cast<uint32_t>(c1);
      out[i + 2] = ~static_cast<uint32_t>(c2);
      out[i + 3] = ~static_cast<uint32_t>(c3);
    }
  }
  for (; i < n; i++) out[i] = ~update_hw(0xFFFFFFFFu, pages[i], bytes);
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

uint32_t crc32c_table(const void* data, size_t len, uint32_t prev) {
  return ~update_table(~prev, static_cast<const uint8_t*>(data), len);
}

uint32_t crc32c(const void* data, size_t len, uint32_t prev) {
#if defined(__x86_64__)
  if (have_sse42()) return ~update_hw(~prev, static_cast<const uint8_t*>(data), len);
#endif
  return crc32c_table(data, len, prev);
}

void crc32c_pages(const uint8_t* const* pages, size_t n, size_t page_bytes, uint32_t* out) {
#if defined(__x86_64__)
  if (have_sse42()) return pages_hw(pages, n, page_bytes, out);
#endif
  for (size_t i = 0; i < n; i++) out[i] = crc32c_table(pages[i], page_bytes);
}

}  // namespace torpor
