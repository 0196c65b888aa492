#include "snapshot/memory_layer.h"

#include <unistd.h>

#include "common/error.h"

namespace torpor {

// Implementation follows; the API is committed first so native/vmm can build against it.
struct MemoryChain::Layer {
  int fd = -1;
};

MemoryChain::MemoryChain() = default;
MemoryChain::MemoryChain(MemoryChain&& o) noexcept = default;
MemoryChain& MemoryChain::operator=(MemoryChain&& o) noexcept = default;
MemoryChain::~MemoryChain() = default;

[[noreturn]] static void not_yet() { throw Error(code::kInternal, "memory layers: not implemented yet"); }

LayerInfo write_full_layer(const std::string&, const std::vector<RamRegion>&) { not_yet(); }
LayerInfo write_diff_layer(const std::string&, uint64_t, const std::string&, const std::vector<PageRef>&) { not_yet(); }
std::string layer_identity(const std::string&) { not_yet(); }
MemoryChain MemoryChain::open(const std::vector<std::string>&, uint64_t) { not_yet(); }
int MemoryChain::bottom_fd() const { not_yet(); }
void MemoryChain::apply_diffs(const std::vector<RamRegion>&) const { not_yet(); }
std::string MemoryChain::top_identity() const { not_yet(); }
size_t MemoryChain::length() const { return layers_.size(); }
LayerInfo merge_memory_layers(const std::vector<std::string>&, uint64_t, const std::string&) { not_yet(); }

}  // namespace torpor
