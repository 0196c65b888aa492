#include "snapshot/disk_layers.h"

#include "common/error.h"

namespace torpor {

// Implementation follows; the API is committed first so native/vmm can build against it.
std::unique_ptr<Disk> open_disk_chain(const std::string&, const std::vector<std::string>&, const std::string&,
                                      uint64_t) {
  throw Error(code::kInternal, "disk layers: not implemented yet");
}
void merge_disk_layers(const std::string&, const std::vector<std::string>&, const std::string&, uint64_t) {
  throw Error(code::kInternal, "disk layers: not implemented yet");
}

}  // namespace torpor
