// The serialisable description of a machine's platform, saved at the head
// of every snapshot's state: what to build (vCPUs, RAM, devices by kind and
// base address, command line, host kind) before loading state into it.
// A restore rebuilds the platform from it and checks that every device sits
// where the saved state says it was.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "snapshot/state_io.h"
#include "vmm/machine.h"

namespace torpor {

struct MachineSpec {
  std::string host_kind;  // host_kind_name()
  MachineConfig config;   // what the machine was built from (kernel path informational on restore)
  std::vector<std::pair<std::string, uint64_t>> devices;  // device name, bus base, in platform order
};

void write_machine_spec(StateWriter& out, const MachineSpec& spec);
// Untrusted input: bounds every field (SNAPSHOT_INVALID).
MachineSpec read_machine_spec(StateReader& in);

}  // namespace torpor
