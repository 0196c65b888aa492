// The on-disk layout of memory layers (docs/snapshot.md) and its parsers.
// The parsers work on bytes in memory so the fuzz target drives exactly
// what MemoryChain::open runs; everything they read is untrusted and every
// refusal is Error(SNAPSHOT_INVALID).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "snapshot/memory_layer.h"

namespace torpor::memory_format {

inline constexpr char kMagic[8] = {'T', 'R', 'P', 'M', 'E', 'M', 'L', 'Y'};
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kKindFull = 1;
inline constexpr uint32_t kKindDiff = 2;
inline constexpr uint64_t kHeaderPageBytes = 4096;  // the header page; the header is its first 128 bytes
inline constexpr size_t kHeaderBytes = 128;
inline constexpr size_t kIndexEntryBytes = 16;
inline constexpr uint64_t kMaxRamBytes = 1ull << 40;  // 1 TiB: keeps every derived offset far from overflow

// Little-endian on disk; x86-64 and aarch64 are little-endian, so the struct is the layout.
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t kind;
  uint64_t ram_bytes;
  uint8_t identity[kLayerIdentityBytes];
  uint8_t parent[kLayerIdentityBytes];  // diff: identity of the layer below; full: zeros
  uint64_t page_count;    // full: pages with data (non-zero pages); diff: index entries
  uint64_t index_offset;  // diff: 4096; full: 0
  uint64_t data_offset;   // full: 4096; diff: index_offset + page_count * 16 rounded up to 4096
  uint64_t file_bytes;    // full: 4096 + ram_bytes; diff: data_offset + page_count * 4096
  uint32_t content_crc;   // full: CRC-32C of every page's CRC-32C (u32 LE, page order); diff: CRC-32C of the index
  uint8_t reserved[32];   // zero
  uint32_t header_crc;    // CRC-32C of bytes 0..123
};
static_assert(sizeof(Header) == kHeaderBytes);

struct IndexEntry {
  uint64_t page;  // linear page index
  uint32_t crc;   // CRC-32C of the page's 4096 bytes
  uint32_t reserved;  // zero
};
static_assert(sizeof(IndexEntry) == kIndexEntryBytes);

// Offsets a header of this kind must carry (the writer's rule).
uint64_t diff_data_offset(uint64_t page_count);

// Validates a header page (kHeaderPageBytes bytes: the header, then zeros).
// Order: size, magic, version, header checksum, kind, fields consistent
// with each other. Does not know the file size or the expected RAM size.
Header parse_header(const uint8_t* page, size_t len);
// Header fields against the actual file size: SNAPSHOT_INVALID when truncated or extended.
void check_file_size(const Header& h, uint64_t file_bytes, const std::string& what);
// Validates a diff index (header.page_count entries): checksum, strictly
// increasing page numbers inside RAM, reserved fields zero.
std::vector<IndexEntry> parse_index(const Header& h, const uint8_t* bytes, size_t len);

Header make_header(uint32_t kind, uint64_t ram_bytes, const uint8_t* identity, const uint8_t* parent,
                   uint64_t page_count, uint32_t content_crc);
std::string identity_hex(const uint8_t* id);
bool parse_identity_hex(const std::string& hex, uint8_t* out);
// The layer writers with a given identity instead of a random one (golden
// files, tests); write_full_layer / write_diff_layer call these.
LayerInfo write_full_layer_as(const std::string& path, const std::vector<RamRegion>& ram,
                              const uint8_t* identity, bool sync);
LayerInfo write_diff_layer_as(const std::string& path, uint64_t ram_bytes, const std::string& parent_identity,
                              const std::vector<PageRef>& pages, const uint8_t* identity, bool sync);

// CRC-32C of a page of zeros (what a hole contributes to a full layer's content checksum).
uint32_t zero_page_crc();

}  // namespace torpor::memory_format
