#include "vmm/x86_64/e820.h"

#include <algorithm>

#include "vmm/x86_64/layout.h"

namespace torpor::x86 {

uint64_t ram_below_hole(uint64_t ram_bytes) { return std::min(ram_bytes, kMmioHoleStart); }
uint64_t ram_above_hole(uint64_t ram_bytes) { return ram_bytes - ram_below_hole(ram_bytes); }

std::vector<E820Entry> build_e820(uint64_t ram_bytes) {
  std::vector<E820Entry> map;
  uint64_t low = ram_below_hole(ram_bytes);
  map.push_back({0, kEbdaStart, E820Type::Ram});
  map.push_back({kEbdaStart, kHighMemStart - kEbdaStart, E820Type::Reserved});
  if (low > kHighMemStart) map.push_back({kHighMemStart, low - kHighMemStart, E820Type::Ram});
  uint64_t high = ram_above_hole(ram_bytes);
  if (high) map.push_back({kMmioHoleEnd, high, E820Type::Ram});
  return map;
}

}  // namespace torpor::x86
