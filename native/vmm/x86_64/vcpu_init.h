// A vCPU's architectural state at boot: registers and segments for the entry
// mode, FPU, boot MSRs and the local APIC's LINT0/LINT1 wiring.
#pragma once

#include <cstdint>
#include <vector>

#include "vmm/kvm.h"
#include "vmm/x86_64/boot.h"

namespace torpor::x86 {

// Every vCPU: FPU, MSRs (only those KVM lists), LAPIC LINT0 = ExtINT, LINT1 = NMI.
void init_vcpu_common(KvmVcpu& vcpu, const std::vector<uint32_t>& msr_index_list);

// vCPU 0 only (the others wait for INIT/SIPI in the in-kernel LAPIC):
// registers and segments for a PVH 32-bit or a 64-bit entry.
void init_boot_vcpu(KvmVcpu& vcpu, const BootEntry& entry);

}  // namespace torpor::x86
