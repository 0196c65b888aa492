// What Machine's restore constructor needs from a validated snapshot
// (machine_snapshot.cc): the memory chain and the state body positioned
// after the machine spec.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "snapshot/memory_layer.h"
#include "base/state_io.h"
#include "vmm/guest_ram.h"
#include "vmm/machine.h"

namespace torpor {

struct RestorePlan {
  std::string dir;
  uint64_t generation = 0;
  std::vector<std::string> chain;  // memory layers, bottom first: relative to dir, or absolute
  std::unique_ptr<MemoryChain> memory;
  std::vector<uint8_t> body;
  std::unique_ptr<StateReader> in;  // over body, after the spec and the chain
  std::vector<std::pair<std::string, uint64_t>> devices;  // from the spec
  PhaseClock clock;  // from the restore call: the phases land in stats().build_phases
};

// Guest RAM over the chain: the bottom layer mapped MAP_PRIVATE over `ram`
// (a VM shell's untouched RAM), diffs read in.
void restore_ram(GuestRam& ram, RestorePlan& plan);

}  // namespace torpor
