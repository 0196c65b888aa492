// The Intel MultiProcessor Specification table (v1.4) that lets a guest
// without ACPI find its CPUs, the IOAPIC and how each interrupt is wired.
//
// One processor entry per vCPU (APIC id = index, vCPU 0 the BSP), one ISA
// bus, the IOAPIC (id = vcpus), an I/O interrupt entry for each ISA IRQ
// 0..15 and for every extra GSI a device uses (virtio-mmio: 5 + i), and the
// local interrupts LINT0 = ExtINT, LINT1 = NMI.
#pragma once

#include <cstdint>
#include <vector>

#include "base/guest_memory.h"

namespace torpor::x86 {

// Writes the floating pointer and the configuration table at `addr`.
// Throws BOOT_FAILED when it does not fit in guest memory.
void write_mptable(GuestMemory& mem, uint64_t addr, uint32_t vcpus, const std::vector<uint32_t>& device_gsis);

// Bytes write_mptable needs (tests, layout checks).
uint64_t mptable_size(uint32_t vcpus, const std::vector<uint32_t>& device_gsis);

}  // namespace torpor::x86
