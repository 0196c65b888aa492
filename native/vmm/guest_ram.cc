#include "vmm/guest_ram.h"

#include <sys/mman.h>

#include "common/error.h"
#include "vmm/x86_64/e820.h"
#include "vmm/x86_64/layout.h"

namespace torpor {

GuestRam::GuestRam(KvmVm& vm, uint64_t ram_bytes, int backing_fd, uint64_t backing_offset)
    : size_(ram_bytes), file_backed_(backing_fd >= 0) {
  if (ram_bytes == 0 || ram_bytes % kPageSize) throw Error(code::kInvalidArgument, "RAM size must be a positive page multiple");
  struct Slot {
    uint64_t gpa, bytes;
  };
  std::vector<Slot> slots;
  slots.push_back({0, x86::ram_below_hole(ram_bytes)});
  if (uint64_t high = x86::ram_above_hole(ram_bytes)) slots.push_back({x86::kMmioHoleEnd, high});
  try {
    uint64_t linear = 0;
    for (uint32_t i = 0; i < slots.size(); i++) {
      // NORESERVE: a 512 MiB guest costs only the pages it touches.
      void* p = backing_fd >= 0
                    ? ::mmap(nullptr, slots[i].bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, backing_fd,
                             static_cast<off_t>(backing_offset + linear))
                    : ::mmap(nullptr, slots[i].bytes, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      linear += slots[i].bytes;
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

void GuestRam::collect_dirty(KvmVm& vm, std::vector<uint64_t>& bitmap) {
  bitmap.resize((size_ / kPageSize + 63) / 64, 0);
  uint64_t first_page = 0;
  for (uint32_t i = 0; i < maps_.size(); i++) {
    uint64_t pages = maps_[i].bytes / kPageSize;
    std::vector<uint64_t> slot((pages + 63) / 64, 0);
    vm.get_dirty_log(i, slot);
    auto vmm = mem_.take_dirty(i);
    for (size_t w = 0; w < slot.size() && w < vmm.size(); w++) slot[w] |= vmm[w];
    for (uint64_t p = 0; p < pages; p++)
      if ((slot[p / 64] >> (p % 64)) & 1) {
        uint64_t lp = first_page + p;
        bitmap[lp / 64] |= uint64_t{1} << (lp % 64);
      }
    first_page += pages;
  }
}

GuestRam::~GuestRam() {
  for (auto& m : maps_) ::munmap(m.host, m.bytes);
}

}  // namespace torpor
