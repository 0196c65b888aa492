// CRC-32C (Castagnoli): the checksum of every snapshot file.
//
// Chosen over CRC-64 for speed on the capture path: x86-64 computes it in
// hardware (SSE4.2 crc32), so a diff layer's per-page checksums cost well
// under a millisecond for 16 MiB. A table-driven (slicing-by-8) version
// serves hosts without SSE4.2 and cross-checks the hardware one in tests.
// Parameters: reflected polynomial 0x82F63B78, initial value and final xor
// 0xFFFFFFFF ("123456789" -> 0xE3069283).
#pragma once

#include <cstddef>
#include <cstdint>

namespace torpor {

// crc32c(b, nb, crc32c(a, na)) == crc32c of a followed by b.
uint32_t crc32c(const void* data, size_t len, uint32_t prev = 0);
// The table-driven implementation (what crc32c uses without SSE4.2).
uint32_t crc32c_table(const void* data, size_t len, uint32_t prev = 0);
// Checksums of n pages of `page_bytes` each (several pages at once, to keep
// the CPU's crc32 unit busy): out[i] = crc32c(pages[i], page_bytes).
void crc32c_pages(const uint8_t* const* pages, size_t n, size_t page_bytes, uint32_t* out);

}  // namespace torpor
