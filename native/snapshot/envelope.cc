#include "snapshot/envelope.h"

namespace torpor {

// Implementation follows; the API is committed first so native/vmm can build against it.
std::vector<uint8_t> encode_state_file(const HostFingerprint&, const std::vector<uint8_t>&) {
  throw Error(code::kInternal, "snapshot envelope: not implemented yet");
}
void write_state_file(const std::string&, const HostFingerprint&, const std::vector<uint8_t>&) {
  throw Error(code::kInternal, "snapshot envelope: not implemented yet");
}
std::vector<uint8_t> read_state_file(const std::string&, const HostFingerprint&) {
  throw Error(code::kInternal, "snapshot envelope: not implemented yet");
}
std::vector<uint8_t> parse_state_file(const uint8_t*, size_t, const HostFingerprint&) {
  throw Error(code::kInternal, "snapshot envelope: not implemented yet");
}

}  // namespace torpor
