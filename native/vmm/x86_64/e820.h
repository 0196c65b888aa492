// The guest's physical memory map (e820 / PVH memmap), from the RAM size.
#pragma once

#include <cstdint>
#include <vector>

namespace torpor::x86 {

enum class E820Type : uint32_t { Ram = 1, Reserved = 2 };

struct E820Entry {
  uint64_t addr;
  uint64_t size;
  E820Type type;
};

// RAM of ram_bytes split around the MMIO hole, per docs/platform.md.
std::vector<E820Entry> build_e820(uint64_t ram_bytes);

// RAM below the hole ([0, min(ram, 3 GiB))) and above it (from 4 GiB).
uint64_t ram_below_hole(uint64_t ram_bytes);
uint64_t ram_above_hole(uint64_t ram_bytes);

}  // namespace torpor::x86
