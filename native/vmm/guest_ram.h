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
  // With backing_fd >= 0, RAM is the file's contents from backing_offset on
  // (RAM's linear image: slot 0 then slot 1), mapped MAP_PRIVATE: lazy and
  // copy-on-write, the file is never written. The file must hold ram_bytes.
  GuestRam(KvmVm& vm, uint64_t ram_bytes, int backing_fd = -1, uint64_t backing_offset = 0);
  ~GuestRam();
  GuestRam(const GuestRam&) = delete;
  GuestRam& operator=(const GuestRam&) = delete;

  GuestMemory& memory() { return mem_; }
  uint64_t size() const { return size_; }
  size_t slot_count() const { return maps_.size(); }
  bool file_backed() const { return file_backed_; }
  // Pages written since the last call, by the guest (KVM's dirty log) or by
  // the VMM (GuestMemory's bitmap), ORed into `bitmap`: RAM's linear page
  // index (slot 0 then slot 1). Resized to cover RAM.
  void collect_dirty(KvmVm& vm, std::vector<uint64_t>& bitmap);

 private:
  struct Mapping {
    void* host;
    uint64_t bytes;
  };
  std::vector<Mapping> maps_;
  GuestMemory mem_;
  uint64_t size_;
  bool file_backed_ = false;
};

}  // namespace torpor
