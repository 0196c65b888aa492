// The XSAVE part of a vCPU's CPUID (leaf 0xD) made consistent with its feature
// leaves, and the XCR0 a vCPU starts with.
//
// KVM_GET_SUPPORTED_CPUID can list state components whose feature bit it does
// not offer: in the nested host, L1's KVM reports XCR0 bits 0x207 (PKRU among
// them) while it clears PKU from leaf 7 (L1 has no OSPKE). A guest sizes its
// XSAVE area from leaf 0xD's sub-leaves for the components it enables (those
// with their feature bit) and checks that against the size CPUID reports for
// its XCR0; when they disagree, Linux warns "XSAVE consistency problem" and
// runs without XSAVE (no AVX). So a component is offered only with its feature
// bit, a feature bit only with its components, and the sizes in sub-leaves 0
// and 1 are recomputed for what is offered.
#pragma once

#include <linux/kvm.h>

#include <cstdint>
#include <vector>

namespace torpor::x86 {

// Shapes leaf 0xD and the XSAVE-dependent feature bits of leaves 1 and 7 in
// place. `xsaves_usable`: the host lets a vCPU use IA32_XSS (without it, XSAVES
// and every supervisor component are withdrawn).
void shape_xstate_cpuid(std::vector<kvm_cpuid_entry2>& entries, bool xsaves_usable);

// The user state components a shaped CPUID offers (leaf 0xD.0 EDX:EAX), which
// is the XCR0 a guest OS enables; 0 when XSAVE is not offered.
uint64_t offered_xcr0(const std::vector<kvm_cpuid_entry2>& entries);

// Size in bytes of an XSAVE area holding `components`, in the standard
// (offsets from the sub-leaves) or the compacted format, from the sub-leaves
// in `entries`. A component without a sub-leaf adds nothing.
uint32_t xsave_area_size(const std::vector<kvm_cpuid_entry2>& entries, uint64_t components, bool compacted);

}  // namespace torpor::x86
