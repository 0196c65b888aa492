#include "vmm/x86_64/cpuid.h"

#include <algorithm>
#include <cstring>
#include <mutex>

#include "common/error.h"
#include "vmm/kvm.h"
#include "vmm/x86_64/xstate.h"

namespace torpor::x86 {

namespace {

constexpr uint32_t kMsrTscAdjust = 0x3b;
constexpr uint32_t kMsrSpecCtrl = 0x48;
constexpr uint32_t kMsrArchCapabilities = 0x10a;
constexpr uint32_t kMsrXss = 0xda0;

bool listed(const std::vector<uint32_t>& list, uint32_t msr) {
  return std::find(list.begin(), list.end(), msr) != list.end();
}

// An MSR is usable when KVM lists it, and a vCPU can read it and write the
// value back (the write is what failed for QEMU on this kind of host).
bool usable(KvmVcpu& vcpu, const std::vector<uint32_t>& list, uint32_t msr) {
  if (!listed(list, msr)) return false;
  uint64_t v = 0;
  if (!vcpu.get_msr(msr, &v)) return false;
  return vcpu.set_msrs({{msr, v}}) == 1;
}

uint32_t bits_for(uint32_t n) {
  uint32_t b = 0;
  while ((1u << b) < n) b++;
  return b;
}

}  // namespace

const MsrSupport& msr_support(const KvmSystem& sys) {
  static MsrSupport support;
  static bool probed = false;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (!probed) {
    MsrSupport s;
    s.index_list = sys.msr_index_list();
    KvmVm vm(sys);
    KvmVcpu vcpu(sys, vm, 0);
    s.arch_capabilities = usable(vcpu, s.index_list, kMsrArchCapabilities);
    s.tsc_adjust = usable(vcpu, s.index_list, kMsrTscAdjust);
    s.spec_ctrl = usable(vcpu, s.index_list, kMsrSpecCtrl);
    s.xss = usable(vcpu, s.index_list, kMsrXss);
    support = std::move(s);
    probed = true;
  }
  return support;
}

std::vector<kvm_cpuid_entry2> build_cpuid(const std::vector<kvm_cpuid_entry2>& supported, uint32_t index,
                                          uint32_t vcpus, HostKind kind, const MsrSupport& msrs) {
  std::vector<kvm_cpuid_entry2> out;
  out.reserve(supported.size());
  const uint32_t core_bits = bits_for(vcpus);
  for (auto e : supported) {
    switch (e.function) {
      case 1:
        e.ebx = (e.ebx & 0x0000ffff) | (index << 24) | ((vcpus & 0xff) << 16);
        e.ecx |= 1u << 31;  // running under a hypervisor
        if (vcpus > 1) e.edx |= 1u << 28;  // HTT: the count in EBX[23:16] is valid
        break;
      case 6:
        e.ecx &= ~(1u << 3);  // no energy-performance bias MSR
        break;
      case 7:
        if (e.index == 0) {
          if (!msrs.tsc_adjust) e.ebx &= ~(1u << 1);
          if (!msrs.arch_capabilities) e.edx &= ~(1u << 29);
          if (!msrs.spec_ctrl) e.edx &= ~((1u << 26) | (1u << 27) | (1u << 31));
        }
        break;
      case 0xa:
        e.eax = e.ebx = e.ecx = e.edx = 0;  // no PMU
        break;
      case 0xb:
      case 0x1f:
        e.edx = index;  // x2APIC id
        if (e.index == 0) {
          e.eax = 0;  // no SMT: the core level starts at bit 0
          e.ebx = 1;
          e.ecx = (1u << 8) | 0;
        } else if (e.index == 1) {
          e.eax = core_bits;
          e.ebx = vcpus;
          e.ecx = (2u << 8) | 1;
        } else {
          e.eax = e.ebx = 0;
          e.ecx = e.index;
        }
        break;
      case 0x40000000:
        if (kind == HostKind::Hardware) {
          e.eax = std::max(e.eax, 0x40000001u);
          std::memcpy(&e.ebx, "KVMK", 4);
          std::memcpy(&e.ecx, "VMKV", 4);
          std::memcpy(&e.edx, "M\0\0\0", 4);
        }
        break;
      case 0x80000008:
        if (!msrs.spec_ctrl) e.ebx &= ~((1u << 14) | (1u << 15) | (1u << 24));  // IBRS, STIBP, SSBD
        break;
      default:
        break;
    }
    out.push_back(e);
  }
  // Leaf 0xD agreeing with the feature leaves; XSAVES needs IA32_XSS.
  shape_xstate_cpuid(out, msrs.xss);
  return out;
}

}  // namespace torpor::x86
