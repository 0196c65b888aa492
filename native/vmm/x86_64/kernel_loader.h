// Loads a guest kernel into guest memory. Three forms are accepted:
//   - an ELF (32- or 64-bit) with a Xen PVH note (XEN_ELFNOTE_PHYS32_ENTRY):
//     entered in 32-bit protected mode, paging off, RBX -> hvm_start_info;
//   - an ELF64 without the note: the 64-bit Linux boot protocol at e_entry;
//   - a bzImage (boot protocol >= 2.12 with XLF_KERNEL_64): its protected-mode
//     part is loaded and entered in 64-bit mode at load address + 0x200.
// The file is untrusted: every size and offset is checked (overflow included)
// and anything that does not fit in guest RAM is refused with BOOT_FAILED.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/guest_memory.h"

namespace torpor::x86 {

enum class EntryMode { Pvh32, Linux64 };

struct LoadedKernel {
  EntryMode mode = EntryMode::Pvh32;
  uint64_t entry = 0;        // guest-physical entry point
  uint64_t end = 0;          // first byte above everything loaded
  bool is_bzimage = false;
  // bzImage: the setup header bytes to copy into boot_params (offset 0x1f1 on).
  std::vector<uint8_t> setup_header;
  uint16_t boot_protocol = 0;
  uint32_t initrd_addr_max = 0;  // bzImage: highest address for the initrd's last byte
  uint32_t cmdline_size = 0;     // bzImage: longest command line the kernel takes
};

// Parses `image` (a kernel file's bytes) and copies it into `mem`. `ram_top`
// bounds where it may land (RAM below the MMIO hole).
LoadedKernel load_kernel_image(GuestMemory& mem, const std::vector<uint8_t>& image, uint64_t ram_top);

// Reads a whole file, refusing more than max_bytes (BOOT_FAILED / IO_ERROR).
std::vector<uint8_t> read_file(const std::string& path, uint64_t max_bytes, const char* what);

}  // namespace torpor::x86
