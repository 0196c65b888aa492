// The CPUID a vCPU sees: KVM_GET_SUPPORTED_CPUID, adjusted per vCPU.
//
// - APIC ids: leaf 1 EBX[31:24], leaves 0xB and 0x1F EDX (x2APIC id), with a
//   flat topology of `vcpus` cores in one package.
// - The HYPERVISOR bit is set; the PMU leaf 0xA is cleared.
// - Hypervisor leaves 0x40000000+: on a hardware host, the KVM signature; on a
//   PVM host they pass through unchanged (the guest detects PVM there).
// - Leaf 0xD is made consistent with the feature leaves (xstate.h).
// - Features whose MSR this host cannot read are masked (QEMU `-cpu host`
//   dies on PVM setting MSR 0x10a): see MsrSupport.
#pragma once

#include <linux/kvm.h>

#include <cstdint>
#include <vector>

#include "vmm/host_probe.h"

namespace torpor {
class KvmSystem;
}

namespace torpor::x86 {

// Which feature MSRs a vCPU of this host can actually read and write back.
struct MsrSupport {
  bool arch_capabilities = false;  // 0x10a
  bool tsc_adjust = false;         // 0x3b
  bool spec_ctrl = false;          // 0x48
  bool xss = false;                // 0xda0
  std::vector<uint32_t> index_list;  // KVM_GET_MSR_INDEX_LIST
};

// Probed once per process on a scratch VM (cheap: one VM, one vCPU) and cached.
const MsrSupport& msr_support(const KvmSystem& sys);

std::vector<kvm_cpuid_entry2> build_cpuid(const std::vector<kvm_cpuid_entry2>& supported, uint32_t vcpu_index,
                                          uint32_t vcpus, HostKind kind, const MsrSupport& msrs);

}  // namespace torpor::x86
