// The guest's RAM: anonymous mappings registered with KVM as memory slots
// (dirty logging on, for diff snapshots) and wrapped in the bounds-checked
// GuestMemory every access goes through.
//
// Layout (docs/platform.md): slot 0 covers [0, min(size, 3 GiB)); slot 1,
// when the size goes beyond 3 GiB, covers the rest from 4 GiB up.
#pragma once

#include <cstdint>
#include <vector>

#include "base/guest_memory.h"
#include "vmm/kvm.h"

namespace torpor {

class GuestRam {
 public:
  // Maps ram_bytes (page multiple) and registers the slots with the VM.
  GuestRam(KvmVm& vm, uint64_t ram_bytes);
  ~GuestRam();
  GuestRam(const GuestRam&) = delete;
  GuestRam& operator=(const GuestRam&) = delete;

  GuestMemory& memory() { return mem_; }
  uint64_t size() const { return size_; }

 private:
  struct Mapping {
    void* host;
    uint64_t bytes;
  };
  std::vector<Mapping> maps_;
  GuestMemory mem_;
  uint64_t size_;
};

}  // namespace torpor
