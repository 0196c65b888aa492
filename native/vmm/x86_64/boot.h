// Puts everything a kernel needs at entry into guest memory: the kernel
// itself, the initrd, the command line, the memory map, the MP table and
// either the PVH start info or the 64-bit boot protocol's zero page, GDT and
// identity page tables. Returns where and how vCPU 0 enters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/guest_memory.h"
#include "vmm/x86_64/kernel_loader.h"

namespace torpor::x86 {

struct BootConfig {
  std::string kernel_path;
  std::string initrd_path;  // empty: none
  std::string cmdline;      // complete (virtio_mmio.device= entries already appended)
  uint64_t ram_bytes = 0;
  uint32_t vcpus = 1;
  std::vector<uint32_t> device_gsis;  // GSIs used beyond the ISA IRQs (for the MP table)
};

struct BootEntry {
  EntryMode mode = EntryMode::Pvh32;
  uint64_t rip = 0;
  uint64_t boot_info = 0;  // PVH: RBX (hvm_start_info); 64-bit: RSI (zero page)
};

BootEntry load_boot_image(GuestMemory& mem, const BootConfig& cfg);

// Same, from kernel bytes already in memory (tests).
BootEntry load_boot_image(GuestMemory& mem, const BootConfig& cfg, const std::vector<uint8_t>& kernel);

}  // namespace torpor::x86
