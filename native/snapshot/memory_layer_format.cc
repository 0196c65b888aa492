#include "snapshot/memory_layer_format.h"

#include <cstring>

#include "common/error.h"
#include "snapshot/crc32c.h"

namespace torpor::memory_format {
namespace {

[[noreturn]] void invalid(const std::string& why) {
  throw Error(code::kSnapshotInvalid, "memory layer is not valid: " + why);
}

uint64_t round_up_page(uint64_t v) { return (v + kPageSize - 1) / kPageSize * kPageSize; }

// Zero first byte, and every byte equal to the one before it. One memcmp, not a branch per
// byte: a header page is ~4 KiB of these, most of a parse's cost under fuzz instrumentation.
bool all_zero(const uint8_t* p, size_t n) {
  return n == 0 || (p[0] == 0 && std::memcmp(p, p + 1, n - 1) == 0);
}

}  // namespace

uint64_t diff_data_offset(uint64_t page_count) {
  return round_up_page(kHeaderPageBytes + page_count * kIndexEntryBytes);
}

uint32_t zero_page_crc() {
  static const uint32_t crc = [] {
    static const uint8_t zeros[kPageSize] = {};
    return crc32c(zeros, sizeof zeros);
  }();
  return crc;
}

Header parse_header(const uint8_t* page, size_t len) {
  if (len < kHeaderPageBytes) invalid("file is truncated (" + std::to_string(len) + " bytes, less than its header page)");
  Header h;
  std::memcpy(&h, page, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) invalid("bad magic (not a torpor memory layer)");
  if (h.version != kVersion)
    invalid("format version " + std::to_string(h.version) + ", this build reads version " + std::to_string(kVersion));
  if (crc32c(page, offsetof(Header, header_crc)) != h.header_crc) invalid("header checksum mismatch (corrupt header)");
  if (!all_zero(h.reserved, sizeof h.reserved) || !all_zero(page + kHeaderBytes, kHeaderPageBytes - kHeaderBytes))
    invalid("reserved header bytes are not zero");
  if (h.ram_bytes == 0 || h.ram_bytes % kPageSize != 0 || h.ram_bytes > kMaxRamBytes)
    invalid("RAM size " + std::to_string(h.ram_bytes) + " is not a whole number of pages up to 1 TiB");
  const uint64_t ram_pages = h.ram_bytes / kPageSize;
  if (h.page_count > ram_pages)
    invalid("claims " + std::to_string(h.page_count) + " pages, RAM has " + std::to_string(ram_pages));
  if (all_zero(h.identity, sizeof h.identity)) invalid("identity is all zeros");
  if (h.kind == kKindFull) {
    if (!all_zero(h.parent, sizeof h.parent)) invalid("a full layer names a parent");
    if (h.index_offset != 0 || h.data_offset != kMemoryDataOffset || h.file_bytes != kMemoryDataOffset + h.ram_bytes)
      invalid("full layer offsets do not match its RAM size");
  } else if (h.kind == kKindDiff) {
    if (all_zero(h.parent, sizeof h.parent)) invalid("a diff layer names no parent");
    if (h.index_offset != kHeaderPageBytes || h.data_offset != diff_data_offset(h.page_count) ||
        h.file_bytes != h.data_offset + h.page_count * kPageSize)
      invalid("diff layer offsets do not match its page count");
  } else {
    invalid("unknown layer kind " + std::to_string(h.kind));
  }
  return h;
}

void check_file_size(const Header& h, uint64_t file_bytes, const std::string& what) {
  if (file_bytes != h.file_bytes)
    invalid(what + " is " + std::to_string(file_bytes) + " bytes, its header says " + std::to_string(h.file_bytes) +
            (file_bytes < h.file_bytes ? " (truncated)" : " (extended)"));
}

std::vector<IndexEntry> parse_index(const Header& h, const uint8_t* bytes, size_t len) {
  if (h.kind != kKindDiff) invalid("only diff layers have an index");
  if (len != h.page_count * kIndexEntryBytes) invalid("index is truncated");
  if (crc32c(bytes, len) != h.content_crc) invalid("index checksum mismatch (corrupt index)");
  std::vector<IndexEntry> index(h.page_count);
  if (len) std::memcpy(index.data(), bytes, len);
  const uint64_t ram_pages = h.ram_bytes / kPageSize;
  for (size_t i = 0; i < index.size(); i++) {
    const IndexEntry& e = index[i];
    if (e.reserved != 0) invalid("index entry " + std::to_string(i) + " has reserved bits set");
    if (e.page >= ram_pages)
      invalid("index entry " + std::to_string(i) + " names page " + std::to_string(e.page) + " outside RAM");
    if (i > 0 && e.page <= index[i - 1].page)
      invalid("index is not strictly increasing at entry " + std::to_string(i));
  }
  return index;
}

Header make_header(uint32_t kind, uint64_t ram_bytes, const uint8_t* identity, const uint8_t* parent,
                   uint64_t page_count, uint32_t content_crc) {
  Header h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.kind = kind;
  h.ram_bytes = ram_bytes;
  std::memcpy(h.identity, identity, kLayerIdentityBytes);
  if (parent) std::memcpy(h.parent, parent, kLayerIdentityBytes);
  h.page_count = page_count;
  if (kind == kKindFull) {
    h.data_offset = kMemoryDataOffset;
    h.file_bytes = kMemoryDataOffset + ram_bytes;
  } else {
    h.index_offset = kHeaderPageBytes;
    h.data_offset = diff_data_offset(page_count);
    h.file_bytes = h.data_offset + page_count * kPageSize;
  }
  h.content_crc = content_crc;
  h.header_crc = crc32c(&h, offsetof(Header, header_crc));
  return h;
}

std::string identity_hex(const uint8_t* id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < kLayerIdentityBytes; i++) {
    s += kDigits[id[i] >> 4];
    s += kDigits[id[i] & 15];
  }
  return s;
}

bool parse_identity_hex(const std::string& hex, uint8_t* out) {
  if (hex.size() != 2 * kLayerIdentityBytes) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < kLayerIdentityBytes; i++) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

}  // namespace torpor::memory_format
