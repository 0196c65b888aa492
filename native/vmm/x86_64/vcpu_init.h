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

// XCR0 starting at `xcr0` (the user components the vCPU's CPUID offers,
// offered_xcr0()) instead of the reset value 1. A guest OS sets XCR0 itself,
// and KVM follows through its XSETBV exit; but QEMU's emulated SVM (the nested
// host) runs a guest's XSETBV without that exit, so KVM never sees the guest's
// value: its CPUID 0xD sizes stay those of XCR0 = 1 and, between exits, it
// reloads XCR0 = 1, and Linux disables XSAVE ("XSAVE consistency problem").
// Starting at the set the guest enables keeps both right there, and changes
// nothing where XSETBV exits. Best effort: a host that refuses leaves reset.
void init_xcr0(KvmVcpu& vcpu, uint64_t xcr0);

// vCPU 0 only (the others wait for INIT/SIPI in the in-kernel LAPIC):
// registers and segments for a PVH 32-bit or a 64-bit entry.
void init_boot_vcpu(KvmVcpu& vcpu, const BootEntry& entry);

}  // namespace torpor::x86
