#include "vmm/guest_ram.h"

#include <sys/mman.h>

#include "common/error.h"
#include "vmm/x86_64/e820.h"
#include "vmm/x86_64/layout.h"

namespace torpor {

GuestRam::GuestRam(KvmVm& vm, uint64_t ram_bytes) : size_(ram_bytes) {
  if (ram_bytes == 0 || ram_bytes % kPageSize) throw Error(code::kInvalidArgument, "RAM size must be a positive page multiple");
  struct Slot {
    uint64_t gpa, bytes;
  };
  std::vector<Slot> slots;
  slots.push_back({0, x86::ram_below_hole(ram_bytes)});
  if (uint64_t high = x86::ram_above_hole(ram_bytes)) slots.push_back({x86::kMmioHoleEnd, high});
  try {
    for (uint32_t i = 0; i < slots.size(); i++) {
      // NORESERVE: a 512 MiB guest costs only the pages it touches.
      void* p = ::mmap(nullptr, slots[i].bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) throw_sys_error(code::kInternal, "mmap guest RAM");
      maps_.push_back({p, slots[i].bytes});
      vm.set_user_memory_region(i, slots[i].gpa, slots[i].bytes, p, KVM_MEM_LOG_DIRTY_PAGES);
      if (!mem_.add_region({slots[i].gpa, slots[i].bytes, static_cast<uint8_t*>(p)}))
        throw Error(code::kInternal, "guest RAM region rejected");
    }
  } catch (...) {
    for (auto& m : maps_) ::munmap(m.host, m.bytes);
    throw;
  }
}

GuestRam::~GuestRam() {
  for (auto& m : maps_) ::munmap(m.host, m.bytes);
}

}  // namespace torpor
