// The state file (vm.state) of a snapshot generation: an envelope around
// the machine's serialized state (spec + vCPU + VM + device state, written by
// native/vmm with StateWriter).
//
// Layout (little-endian; docs/snapshot.md has it byte by byte):
//   magic "TORPORST" | u32 format version | u32 flags | u64 body length |
//   fingerprint (StateWriter encoding) | body | u64 CRC-64 of everything before it
// Loading validates, in this order: file size (>= minimum, <= kMaxStateFileBytes),
// magic, version, body length (consistent with the file size), checksum, and
// only then the fingerprint against this host. Corrupt, truncated or another
// version -> Error(SNAPSHOT_INVALID); another host kind or CPU ->
// Error(SNAPSHOT_INCOMPATIBLE); a file that cannot be read -> Error(IO_ERROR).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "snapshot/fingerprint.h"

namespace torpor {

inline constexpr char kStateMagic[8] = {'T', 'O', 'R', 'P', 'O', 'R', 'S', 'T'};
inline constexpr uint32_t kStateFormatVersion = 1;
inline constexpr uint64_t kMaxStateFileBytes = 64ull << 20;  // machine state is KiBs; refuse anything huge

// Writes the file (truncating it) and fsyncs it. Throws Error(IO_ERROR), or
// Error(INVALID_ARGUMENT) when the body would exceed the size cap.
void write_state_file(const std::string& path, const HostFingerprint& fp, const std::vector<uint8_t>& body);
// Returns the body after validating the whole file against this host.
std::vector<uint8_t> read_state_file(const std::string& path, const HostFingerprint& here);
// The same from bytes in memory (what the loader fuzz target drives).
std::vector<uint8_t> parse_state_file(const uint8_t* data, size_t size, const HostFingerprint& here);
// The bytes write_state_file writes (for tests and golden files).
std::vector<uint8_t> encode_state_file(const HostFingerprint& fp, const std::vector<uint8_t>& body);

}  // namespace torpor
