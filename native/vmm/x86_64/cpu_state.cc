#include "vmm/x86_64/cpu_state.h"

#include <sys/ioctl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>

#include "common/error.h"
#include "vmm/kvm_abi.h"

namespace torpor::x86 {

namespace {

constexpr const char* kVcpuTag = "x86-vcpu";
constexpr uint32_t kVcpuVersion = 1;
constexpr const char* kVmTag = "x86-vm";
constexpr uint32_t kVmVersion = 1;

constexpr uint32_t kMsrTsc = 0x10;
constexpr uint32_t kMsrTscDeadline = 0x6e0;
constexpr size_t kMaxCpuidEntries = 256;
constexpr size_t kMaxMsrs = 2048;
constexpr size_t kMaxXsaveBytes = 1 << 20;

// Pieces of vCPU state; a bit is set in the saved flags when it was read.
enum Piece : uint32_t {
  kMpState = 1 << 0,
  kXsave = 1 << 1,
  kXcrs = 1 << 2,
  kDebugRegs = 1 << 3,
  kEvents = 1 << 4,
  kTscKhz = 1 << 5,
};

bool allowed_msr(uint32_t i) {
  switch (i) {
    case 0x10: case 0x11: case 0x12:             // TSC, kvmclock (legacy wall clock, system time)
    case 0x1b: case 0x3b: case 0x48:             // APIC base, TSC_ADJUST, SPEC_CTRL
    case 0x174: case 0x175: case 0x176:          // SYSENTER
    case 0x179: case 0x17a: case 0x17b:          // MCG
    case 0x1a0: case 0x6e0: case 0xda0:          // MISC_ENABLE, TSC_DEADLINE, XSS
    case 0xc0000080: case 0xc0000081: case 0xc0000082: case 0xc0000083: case 0xc0000084:  // EFER, STAR..SFMASK
    case 0xc0000100: case 0xc0000101: case 0xc0000102: case 0xc0000103:                   // FS/GS/KGS base, TSC_AUX
      return true;
    default:
      break;
  }
  if (i >= 0x200 && i <= 0x2ff) return true;          // MTRRs, PAT
  if (i >= 0x400 && i <= 0x47f) return true;          // MC banks
  if (i >= 0x800 && i <= 0xbff) return true;          // x2APIC
  if (i >= 0x4b564d00 && i <= 0x4b564dff) return true;  // KVM paravirtual (kvmclock, async PF, steal time, PV EOI)
  return false;
}

int raw_ioctl(int fd, unsigned long req, void* arg) { return kvm_ioctl(fd, req, reinterpret_cast<unsigned long>(arg)); }

[[noreturn]] void refused(const char* what) {
  int e = errno;
  // KVM refusing a state it was given back means the state does not fit this host.
  throw Error(code::kSnapshotIncompatible, std::string(what) + " refused the saved state: " + std::strerror(e), e);
}

size_t xsave_bytes(const KvmVm& vm) {
  int n = vm.check_extension(KVM_CAP_XSAVE2);
  return n > static_cast<int>(kvm_abi::kXsaveBytes) ? static_cast<size_t>(n) : kvm_abi::kXsaveBytes;
}

template <typename T>
void put(StateWriter& out, const T& v) { out.pod(v); }

std::vector<std::pair<uint32_t, uint64_t>> get_msrs(KvmVcpu& vcpu, const std::vector<uint32_t>& list) {
  std::vector<uint8_t> buf(kvm_abi::kMsrsHeader + list.size() * sizeof(kvm_msr_entry), 0);
  uint32_t n = static_cast<uint32_t>(list.size());
  std::memcpy(buf.data(), &n, 4);
  for (size_t i = 0; i < list.size(); i++) {
    kvm_msr_entry e{};
    e.index = list[i];
    std::memcpy(buf.data() + kvm_abi::kMsrsHeader + i * sizeof(e), &e, sizeof(e));
  }
  int r = raw_ioctl(vcpu.fd(), kvm_abi::kGetMsrs, buf.data());
  if (r < 0) throw_sys_error(code::kInternal, "KVM_GET_MSRS");
  if (static_cast<size_t>(r) != list.size())
    throw Error(code::kInternal, "KVM_GET_MSRS read " + std::to_string(r) + " of " + std::to_string(list.size()) +
                                     " MSRs probed readable");
  std::vector<std::pair<uint32_t, uint64_t>> out;
  for (size_t i = 0; i < list.size(); i++) {
    kvm_msr_entry e;
    std::memcpy(&e, buf.data() + kvm_abi::kMsrsHeader + i * sizeof(e), sizeof(e));
    out.emplace_back(e.index, e.data);
  }
  return out;
}

}  // namespace

const std::vector<uint32_t>& snapshot_msrs(const KvmSystem& sys) {
  static std::mutex mu;
  static std::vector<uint32_t>* list = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!list) {
    auto out = std::make_unique<std::vector<uint32_t>>();
    KvmVm vm(sys);
    KvmVcpu vcpu(sys, vm, 0);
    bool deadline = false;
    for (uint32_t i : sys.msr_index_list()) {
      if (!allowed_msr(i)) continue;
      uint64_t v;
      if (!vcpu.get_msr(i, &v)) continue;
      if (i == kMsrTscDeadline)
        deadline = true;
      else
        out->push_back(i);
    }
    if (deadline) out->push_back(kMsrTscDeadline);  // last: after IA32_TSC
    list = out.release();
  }
  return *list;
}

void save_vcpu(const KvmSystem& sys, const KvmVm& vm, KvmVcpu& vcpu, StateWriter& out) {
  const int fd = vcpu.fd();
  uint32_t flags = 0;
  kvm_mp_state mp{};
  if (raw_ioctl(fd, KVM_GET_MP_STATE, &mp) == 0) flags |= kMpState;  // first: it may change the LAPIC
  kvm_regs regs{};
  vcpu.ioctl_or_throw(KVM_GET_REGS, &regs, "KVM_GET_REGS");
  kvm_sregs sregs{};
  vcpu.ioctl_or_throw(KVM_GET_SREGS, &sregs, "KVM_GET_SREGS");
  std::vector<uint8_t> xsave(xsave_bytes(vm), 0);
  {
    bool big = xsave.size() > kvm_abi::kXsaveBytes;
    if (raw_ioctl(fd, big ? kvm_abi::kGetXsave2 : kvm_abi::kGetXsave, xsave.data()) == 0) flags |= kXsave;
  }
  kvm_xcrs xcrs{};
  if (raw_ioctl(fd, KVM_GET_XCRS, &xcrs) == 0) flags |= kXcrs;
  kvm_debugregs dbg{};
  if (raw_ioctl(fd, KVM_GET_DEBUGREGS, &dbg) == 0) flags |= kDebugRegs;
  kvm_lapic_state lapic{};
  vcpu.ioctl_or_throw(KVM_GET_LAPIC, &lapic, "KVM_GET_LAPIC");
  uint32_t tsc_khz = 0;
  if (sys.check_extension(KVM_CAP_GET_TSC_KHZ) > 0) {
    int r = raw_ioctl(fd, KVM_GET_TSC_KHZ, nullptr);
    if (r > 0) {
      tsc_khz = static_cast<uint32_t>(r);
      flags |= kTscKhz;
    }
  }
  // CPUID as KVM holds it now (never a cached copy).
  std::vector<uint8_t> cpuid(kvm_abi::kCpuid2Header + kMaxCpuidEntries * sizeof(kvm_cpuid_entry2), 0);
  uint32_t nent = kMaxCpuidEntries;
  std::memcpy(cpuid.data(), &nent, 4);
  vcpu.ioctl_or_throw(kvm_abi::kGetCpuid2, cpuid.data(), "KVM_GET_CPUID2");
  std::memcpy(&nent, cpuid.data(), 4);
  if (nent > kMaxCpuidEntries) throw Error(code::kInternal, "KVM_GET_CPUID2 returned too many entries");
  auto msrs = get_msrs(vcpu, snapshot_msrs(sys));
  kvm_vcpu_events events{};
  if (raw_ioctl(fd, KVM_GET_VCPU_EVENTS, &events) == 0) flags |= kEvents;  // last

  out.header(kVcpuTag, kVcpuVersion);
  out.u32(vcpu.index());
  out.u32(flags);
  put(out, mp);
  put(out, regs);
  put(out, sregs);
  out.bytes(xsave.data(), (flags & kXsave) ? xsave.size() : 0);
  put(out, xcrs);
  put(out, dbg);
  put(out, lapic);
  out.u32(tsc_khz);
  out.bytes(cpuid.data() + kvm_abi::kCpuid2Header, nent * sizeof(kvm_cpuid_entry2));
  out.u32(static_cast<uint32_t>(msrs.size()));
  for (auto& [i, v] : msrs) {
    out.u32(i);
    out.u64(v);
  }
  put(out, events);
}

namespace {

// KVM_{GET,SET,HAS}_DEVICE_ATTR on a vCPU, group KVM_VCPU_TSC_CTRL (Linux 5.16+).
bool tsc_offset_attr(int fd, unsigned long req, uint64_t* value) {
  kvm_device_attr attr{};
  attr.group = KVM_VCPU_TSC_CTRL;
  attr.attr = KVM_VCPU_TSC_OFFSET;
  attr.addr = reinterpret_cast<uintptr_t>(value);
  return raw_ioctl(fd, req, &attr) == 0;
}

// A host-initiated IA32_TSC write that lands within a second (of guest cycles)
// of the VM's last TSC write is taken by KVM (before Linux 6.7's "don't sync
// user-written TSC against startup values") as an attempt to synchronise with
// it: KVM keeps the offset it gave the vCPU at creation (TSC 0) and drops the
// value. A guest captured less than about a second after it started would then
// run on with its TSC back near 0: its TSC deadline timer late by as much, a
// TSC clocksource going backwards (seen with the test guest on a hardware KVM).
// Where KVM lets us set the offset itself, do so: the first vCPU's offset puts
// its TSC on the saved value, and every later vCPU takes that same offset, as
// the vCPUs had one offset when they were captured.
void restore_tsc_offset(KvmVcpu& vcpu, uint64_t saved_tsc, RestoredTsc& tsc) {
  const int fd = vcpu.fd();
  uint64_t current = 0;
  if (!tsc_offset_attr(fd, KVM_HAS_DEVICE_ATTR, &current)) return;  // older KVM: IA32_TSC alone
  if (!tsc.have_offset) {
    uint64_t now = 0;
    if (!tsc_offset_attr(fd, KVM_GET_DEVICE_ATTR, &current) || !vcpu.get_msr(kMsrTsc, &now))
      throw_sys_error(code::kInternal, "reading the restored TSC offset");
    // guest TSC = scaled host TSC + offset: move the offset by what the TSC lacks (mod 2^64).
    tsc.offset = current + (saved_tsc - now);
    tsc.have_offset = true;
  }
  uint64_t offset = tsc.offset;
  if (!tsc_offset_attr(fd, KVM_SET_DEVICE_ATTR, &offset)) refused("KVM_VCPU_TSC_OFFSET");
}

}  // namespace

void restore_vcpu(const KvmSystem& sys, KvmVcpu& vcpu, StateReader& in, RestoredTsc& tsc) {
  in.expect_header(kVcpuTag, kVcpuVersion, kVcpuVersion);
  uint32_t index = in.u32();
  if (index != vcpu.index()) StateReader::fail("vCPU state is for vCPU " + std::to_string(index));
  uint32_t flags = in.u32();
  auto mp = in.pod<kvm_mp_state>();
  auto regs = in.pod<kvm_regs>();
  auto sregs = in.pod<kvm_sregs>();
  auto xsave = in.bytes(kMaxXsaveBytes);
  auto xcrs = in.pod<kvm_xcrs>();
  auto dbg = in.pod<kvm_debugregs>();
  auto lapic = in.pod<kvm_lapic_state>();
  uint32_t tsc_khz = in.u32();
  auto cpuid_entries = in.bytes(kMaxCpuidEntries * sizeof(kvm_cpuid_entry2));
  if (cpuid_entries.size() % sizeof(kvm_cpuid_entry2)) StateReader::fail("vCPU CPUID has a partial entry");
  uint32_t nmsrs = in.u32();
  if (nmsrs > kMaxMsrs) StateReader::fail("vCPU state has too many MSRs");
  std::vector<std::pair<uint32_t, uint64_t>> msrs, deadline;
  for (uint32_t i = 0; i < nmsrs; i++) {
    uint32_t idx = in.u32();
    uint64_t v = in.u64();
    if (!allowed_msr(idx)) StateReader::fail("vCPU state has MSR " + std::to_string(idx) + ", not on the allow-list");
    (idx == kMsrTscDeadline ? deadline : msrs).emplace_back(idx, v);
  }
  auto events = in.pod<kvm_vcpu_events>();
  if ((flags & kXsave) && xsave.size() < kvm_abi::kXsaveBytes) StateReader::fail("vCPU XSAVE area is too short");

  const int fd = vcpu.fd();
  // 0. TSC frequency, only where KVM can scale it (PVM cannot).
  if ((flags & kTscKhz) && tsc_khz && sys.check_extension(KVM_CAP_TSC_CONTROL) > 0) {
    if (raw_ioctl(fd, KVM_SET_TSC_KHZ, reinterpret_cast<void*>(static_cast<uintptr_t>(tsc_khz))) < 0)
      refused("KVM_SET_TSC_KHZ");
  }
  // 1. CPUID before any CPUID-dependent MSR.
  std::vector<uint8_t> cpuid(kvm_abi::kCpuid2Header + cpuid_entries.size(), 0);
  uint32_t nent = static_cast<uint32_t>(cpuid_entries.size() / sizeof(kvm_cpuid_entry2));
  std::memcpy(cpuid.data(), &nent, 4);
  std::memcpy(cpuid.data() + kvm_abi::kCpuid2Header, cpuid_entries.data(), cpuid_entries.size());
  if (raw_ioctl(fd, kvm_abi::kSetCpuid2, cpuid.data()) < 0) refused("KVM_SET_CPUID2");
  // 2-4. MP state, registers, segments (APIC base before the LAPIC).
  if ((flags & kMpState) && raw_ioctl(fd, KVM_SET_MP_STATE, &mp) < 0) refused("KVM_SET_MP_STATE");
  if (raw_ioctl(fd, KVM_SET_REGS, &regs) < 0) refused("KVM_SET_REGS");
  if (raw_ioctl(fd, KVM_SET_SREGS, &sregs) < 0) refused("KVM_SET_SREGS");
  // 5. FPU/extended state, XCRs, debug registers.
  if (flags & kXsave) {
    std::vector<uint8_t> buf(std::max(xsave.size(), kvm_abi::kXsaveBytes), 0);
    std::memcpy(buf.data(), xsave.data(), xsave.size());
    if (raw_ioctl(fd, kvm_abi::kSetXsave, buf.data()) < 0) refused("KVM_SET_XSAVE");
  }
  if ((flags & kXcrs) && raw_ioctl(fd, KVM_SET_XCRS, &xcrs) < 0) refused("KVM_SET_XCRS");
  if ((flags & kDebugRegs) && raw_ioctl(fd, KVM_SET_DEBUGREGS, &dbg) < 0) refused("KVM_SET_DEBUGREGS");
  // 6. LAPIC before the MSRs: a TSC deadline is dropped unless the LVT timer is in deadline mode.
  if (raw_ioctl(fd, KVM_SET_LAPIC, &lapic) < 0) refused("KVM_SET_LAPIC");
  // 7. MSRs, IA32_TSC_DEADLINE in a final chunk after IA32_TSC (and after the TSC offset: KVM
  // arms the deadline timer from the TSC at the write); every one must be taken.
  auto set_chunk = [&vcpu](const std::vector<std::pair<uint32_t, uint64_t>>& chunk) {
    if (chunk.empty()) return;
    size_t set = vcpu.set_msrs(chunk);
    if (set != chunk.size())
      throw Error(code::kSnapshotIncompatible,
                  "KVM_SET_MSRS took " + std::to_string(set) + " of " + std::to_string(chunk.size()) +
                      " MSRs (refused MSR " + std::to_string(set < chunk.size() ? chunk[set].first : 0) + ")");
  };
  set_chunk(msrs);
  for (const auto& [idx, v] : msrs)
    if (idx == kMsrTsc) restore_tsc_offset(vcpu, v, tsc);
  set_chunk(deadline);
  // 8. Pending exceptions, interrupts and NMIs last (SET_REGS cleared them).
  if (flags & kEvents) {
    events.flags &= KVM_VCPUEVENT_VALID_NMI_PENDING | KVM_VCPUEVENT_VALID_SIPI_VECTOR | KVM_VCPUEVENT_VALID_SHADOW |
                    KVM_VCPUEVENT_VALID_SMM | KVM_VCPUEVENT_VALID_PAYLOAD;
    if (raw_ioctl(fd, KVM_SET_VCPU_EVENTS, &events) < 0) refused("KVM_SET_VCPU_EVENTS");
  }
}

namespace {
template <typename T>
std::vector<uint8_t> bytes_of(const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  return std::vector<uint8_t>(p, p + sizeof(T));
}
}  // namespace

void describe_vcpu(StateReader& in, const std::string& prefix, StateParts& out) {
  in.expect_header(kVcpuTag, kVcpuVersion, kVcpuVersion);
  in.u32();
  uint32_t flags = in.u32();
  out.emplace_back(prefix + "flags", bytes_of(flags));
  out.emplace_back(prefix + "mp_state", bytes_of(in.pod<kvm_mp_state>()));
  out.emplace_back(prefix + "regs", bytes_of(in.pod<kvm_regs>()));
  out.emplace_back(prefix + "sregs", bytes_of(in.pod<kvm_sregs>()));
  out.emplace_back(prefix + "xsave", in.bytes(kMaxXsaveBytes));
  out.emplace_back(prefix + "xcrs", bytes_of(in.pod<kvm_xcrs>()));
  out.emplace_back(prefix + "debugregs", bytes_of(in.pod<kvm_debugregs>()));
  out.emplace_back(prefix + "lapic", bytes_of(in.pod<kvm_lapic_state>()));
  out.emplace_back(prefix + "tsc_khz", bytes_of(in.u32()));
  out.emplace_back(prefix + "cpuid", in.bytes(kMaxCpuidEntries * sizeof(kvm_cpuid_entry2)));
  uint32_t n = in.u32();
  if (n > kMaxMsrs) StateReader::fail("too many MSRs");
  for (uint32_t i = 0; i < n; i++) {
    uint32_t idx = in.u32();
    char name[32];
    std::snprintf(name, sizeof name, "msr.0x%x", idx);
    out.emplace_back(prefix + name, bytes_of(in.u64()));
  }
  out.emplace_back(prefix + "events", bytes_of(in.pod<kvm_vcpu_events>()));
}

void describe_vm(StateReader& in, StateParts& out) {
  in.expect_header(kVmTag, kVmVersion, kVmVersion);
  out.emplace_back("vm.pit", bytes_of(in.pod<kvm_pit_state2>()));
  out.emplace_back("vm.clock", bytes_of(in.u64()));
  for (int chip = 0; chip < 3; chip++) out.emplace_back("vm.irqchip" + std::to_string(chip), bytes_of(in.pod<kvm_irqchip>()));
}

void notify_clock_paused(KvmVcpu& vcpu) {
  // EINVAL when the guest never enabled kvmclock: nothing to tell it.
  (void)raw_ioctl(vcpu.fd(), KVM_KVMCLOCK_CTRL, nullptr);
}

void save_vm(KvmVm& vm, StateWriter& out) {
  kvm_pit_state2 pit{};
  if (raw_ioctl(vm.fd(), KVM_GET_PIT2, &pit) < 0) throw_sys_error(code::kInternal, "KVM_GET_PIT2");
  kvm_clock_data clock{};
  if (raw_ioctl(vm.fd(), KVM_GET_CLOCK, &clock) < 0) throw_sys_error(code::kInternal, "KVM_GET_CLOCK");
  out.header(kVmTag, kVmVersion);
  out.pod(pit);
  out.u64(clock.clock);
  for (uint32_t chip = 0; chip < 3; chip++) {  // PIC master, PIC slave, IOAPIC
    kvm_irqchip ic{};
    ic.chip_id = chip;
    if (raw_ioctl(vm.fd(), KVM_GET_IRQCHIP, &ic) < 0) throw_sys_error(code::kInternal, "KVM_GET_IRQCHIP");
    out.pod(ic);
  }
}

void restore_vm(KvmVm& vm, StateReader& in) {
  in.expect_header(kVmTag, kVmVersion, kVmVersion);
  auto pit = in.pod<kvm_pit_state2>();
  uint64_t clock_ns = in.u64();
  kvm_irqchip chips[3];
  for (uint32_t chip = 0; chip < 3; chip++) {
    chips[chip] = in.pod<kvm_irqchip>();
    if (chips[chip].chip_id != chip) StateReader::fail("irqchip state out of order");
  }
  if (raw_ioctl(vm.fd(), KVM_SET_PIT2, &pit) < 0) refused("KVM_SET_PIT2");
  // kvmclock continues from the capture: the guest sees no time pass while
  // it was saved (the agent sets the wall clock after a restore).
  kvm_clock_data clock{};
  clock.clock = clock_ns;
  if (raw_ioctl(vm.fd(), KVM_SET_CLOCK, &clock) < 0) refused("KVM_SET_CLOCK");
  for (auto& ic : chips)
    if (raw_ioctl(vm.fd(), KVM_SET_IRQCHIP, &ic) < 0) refused("KVM_SET_IRQCHIP");
}

}  // namespace torpor::x86
