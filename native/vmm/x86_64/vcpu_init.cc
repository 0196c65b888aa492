#include "vmm/x86_64/vcpu_init.h"

#include <algorithm>
#include <cstring>

#include "vmm/x86_64/layout.h"

namespace torpor::x86 {

namespace {

constexpr uint64_t kCr0Pe = 1ull << 0;
constexpr uint64_t kCr0Et = 1ull << 4;
constexpr uint64_t kCr0Pg = 1ull << 31;
constexpr uint64_t kCr4Pae = 1ull << 5;
constexpr uint64_t kEferLme = 1ull << 8;
constexpr uint64_t kEferLma = 1ull << 10;

constexpr uint32_t kApicLvtLint0 = 0x350;
constexpr uint32_t kApicLvtLint1 = 0x360;
constexpr uint32_t kApicModeExtInt = 0x7;
constexpr uint32_t kApicModeNmi = 0x4;

kvm_segment flat_segment(uint16_t selector, uint8_t type, bool long_code) {
  kvm_segment s{};
  s.base = 0;
  s.limit = 0xffffffff;
  s.selector = selector;
  s.type = type;
  s.present = 1;
  s.dpl = 0;
  s.db = long_code ? 0 : 1;
  s.s = 1;
  s.l = long_code ? 1 : 0;
  s.g = 1;
  return s;
}

uint32_t apic_reg(const kvm_lapic_state& st, uint32_t off) {
  uint32_t v;
  std::memcpy(&v, st.regs + off, 4);
  return v;
}
void set_apic_reg(kvm_lapic_state& st, uint32_t off, uint32_t v) { std::memcpy(st.regs + off, &v, 4); }
uint32_t with_delivery_mode(uint32_t reg, uint32_t mode) { return (reg & ~0x700u) | (mode << 8); }

}  // namespace

void init_vcpu_common(KvmVcpu& vcpu, const std::vector<uint32_t>& msr_list) {
  kvm_fpu fpu{};
  fpu.fcw = 0x37f;
  fpu.mxcsr = 0x1f80;
  vcpu.ioctl_or_throw(KVM_SET_FPU, &fpu, "KVM_SET_FPU");

  // Boot MSRs: what a freshly reset CPU would hold plus fast strings and
  // write-back MTRR default. Only MSRs this host lists: on PVM some are absent.
  const std::pair<uint32_t, uint64_t> wanted[] = {
      {0x174, 0}, {0x175, 0}, {0x176, 0},                    // SYSENTER_CS/ESP/EIP
      {0xc0000081, 0}, {0xc0000082, 0}, {0xc0000083, 0},     // STAR, LSTAR, CSTAR
      {0xc0000084, 0}, {0xc0000102, 0},                      // SFMASK, KERNEL_GS_BASE
      {0x10, 0},                                             // TSC
      {0x1a0, 1},                                            // MISC_ENABLE: fast strings
      {0x2ff, (1u << 11) | 6},                               // MTRRdefType: enabled, write-back
  };
  std::vector<std::pair<uint32_t, uint64_t>> msrs;
  for (const auto& m : wanted)
    if (std::find(msr_list.begin(), msr_list.end(), m.first) != msr_list.end()) msrs.push_back(m);
  // Whatever KVM refuses is left at its reset value: none of these is needed
  // to enter the guest, and a partial set is not an error worth failing on.
  for (size_t done = 0; done < msrs.size();) {
    size_t n = vcpu.set_msrs(std::vector<std::pair<uint32_t, uint64_t>>(msrs.begin() + static_cast<long>(done), msrs.end()));
    done += n + 1;  // skip the refused one
  }

  kvm_lapic_state lapic{};
  vcpu.ioctl_or_throw(KVM_GET_LAPIC, &lapic, "KVM_GET_LAPIC");
  set_apic_reg(lapic, kApicLvtLint0, with_delivery_mode(apic_reg(lapic, kApicLvtLint0), kApicModeExtInt));
  set_apic_reg(lapic, kApicLvtLint1, with_delivery_mode(apic_reg(lapic, kApicLvtLint1), kApicModeNmi));
  vcpu.ioctl_or_throw(KVM_SET_LAPIC, &lapic, "KVM_SET_LAPIC");
}

void init_xcr0(KvmVcpu& vcpu, uint64_t xcr0) {
  if (xcr0 <= 1) return;  // x87 only: the reset value already
  kvm_xcrs xcrs{};
  xcrs.nr_xcrs = 1;
  xcrs.xcrs[0].xcr = 0;
  xcrs.xcrs[0].value = xcr0;
  // A refusal (no KVM_CAP_XCRS, as on some PVM hosts) leaves the reset value,
  // which is right wherever XSETBV exits to KVM.
  (void)kvm_ioctl(vcpu.fd(), KVM_SET_XCRS, reinterpret_cast<unsigned long>(&xcrs));
}

void init_boot_vcpu(KvmVcpu& vcpu, const BootEntry& entry) {
  kvm_sregs sregs{};
  vcpu.ioctl_or_throw(KVM_GET_SREGS, &sregs, "KVM_GET_SREGS");
  kvm_regs regs{};
  regs.rflags = 0x2;
  regs.rip = entry.rip;

  if (entry.mode == EntryMode::Pvh32) {
    // PVH: 32-bit protected mode, paging off, flat 4 GiB segments.
    sregs.cs = flat_segment(0x08, 0xb, false);
    kvm_segment data = flat_segment(0x10, 0x3, false);
    sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss = data;
    sregs.cr0 = kCr0Pe | kCr0Et;
    sregs.cr4 = 0;
    sregs.efer = 0;
    regs.rbx = entry.boot_info;
  } else {
    // 64-bit boot protocol: long mode with the identity map from boot.cc.
    sregs.cs = flat_segment(0x08, 0xb, true);
    kvm_segment data = flat_segment(0x10, 0x3, false);
    sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss = data;
    sregs.gdt.base = kGdtAddr;
    sregs.gdt.limit = 4 * 8 - 1;
    sregs.idt.base = kIdtAddr;
    sregs.idt.limit = 7;
    sregs.cr3 = kPml4Addr;
    sregs.cr4 |= kCr4Pae;
    sregs.cr0 = kCr0Pe | kCr0Et | kCr0Pg;
    sregs.efer |= kEferLme | kEferLma;
    regs.rsi = entry.boot_info;
    regs.rsp = regs.rbp = kBootStack;
  }
  kvm_segment tr{};
  tr.base = 0;
  tr.limit = 0x67;
  tr.selector = 0x18;
  tr.type = 0xb;  // busy 32/64-bit TSS
  tr.present = 1;
  sregs.tr = tr;
  if (entry.mode == EntryMode::Pvh32) {
    sregs.gdt.base = kGdtAddr;
    sregs.gdt.limit = 4 * 8 - 1;
  }
  vcpu.ioctl_or_throw(KVM_SET_SREGS, &sregs, "KVM_SET_SREGS");
  vcpu.ioctl_or_throw(KVM_SET_REGS, &regs, "KVM_SET_REGS");
}

}  // namespace torpor::x86
