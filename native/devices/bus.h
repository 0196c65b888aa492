// The machine's address map for one kind of access (port I/O or MMIO).
//
// The bus owns base addresses; devices only ever see the offset of an access
// inside their own range. Ranges are half-open [base, base + len), must not
// be empty, must not wrap past 2^64 and must not overlap. An access that is
// not wholly inside one range (unmapped, or straddling a range's end) is
// refused and the caller decides what the guest sees (reads of nothing
// return all ones on real hardware).
//
// Threading: insert() is meant for machine setup, but it is safe at any time:
// it takes the map's lock exclusively while read()/write() take it shared,
// so several vCPU threads dispatch at once. Devices serialise internally.
// The bus does not own its devices; they must outlive it or be removed first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <shared_mutex>
#include <vector>

#include "devices/device.h"

namespace torpor {

class Bus {
 public:
  // False on zero length, base + len overflowing, a null device or an
  // overlap with a range already present.
  bool insert(uint64_t base, uint64_t len, BusDevice* dev);
  // Removes the range starting exactly at base; false when there is none.
  bool remove(uint64_t base);

  // Dispatch to the device covering [addr, addr + len) with the offset
  // addr - base. False when no single range covers the whole access
  // (the data buffer is then left untouched).
  bool read(uint64_t addr, uint8_t* data, size_t len) const;
  bool write(uint64_t addr, const uint8_t* data, size_t len) const;

  // The device covering addr and its base, or nullptr (diagnostics, tests).
  BusDevice* device_at(uint64_t addr, uint64_t* base = nullptr) const;
  size_t size() const;

 private:
  struct Range {
    uint64_t base;
    uint64_t len;
    BusDevice* dev;
  };
  // Index into ranges_ of the range wholly covering [addr, addr + len), or -1.
  long find(uint64_t addr, size_t len) const;

  mutable std::shared_mutex mu_;
  std::vector<Range> ranges_;  // sorted by base, disjoint
};

}  // namespace torpor
