// Saving and restoring the x86-64 state KVM holds: per vCPU (registers, FPU,
// LAPIC, MSRs, pending events) and per VM (PIT, kvmclock, PIC and IOAPIC).
//
// Order follows what KVM requires (its API documentation; docs/vmm.md, the
// machine_snapshot row, lists it with the reasons): on save,
// MP_STATE first (reading it may change the LAPIC) and VCPU_EVENTS last; on
// restore CPUID2 before MSRs, REGS before VCPU_EVENTS, SREGS (APIC base)
// before LAPIC, LAPIC before MSRs, IA32_TSC before TSC_DEADLINE (its own
// final chunk), VCPU_EVENTS last. KVM_SET_TSC_KHZ only where
// KVM_CAP_TSC_CONTROL exists (PVM lacks it). Pieces this host's KVM cannot
// read (PVM may refuse some ioctls) are skipped and recorded in the state's
// flags, so the restore does not try them either.
//
// Callers hold every vCPU out of KVM_RUN (the machine is paused).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/state_io.h"
#include "vmm/kvm.h"

namespace torpor::x86 {

// The MSRs a snapshot carries on this host: KVM_GET_MSR_INDEX_LIST filtered
// by an allow-list (Firecracker's, plus the KVM paravirtual range and
// IA32_XSS), each probed readable once per process on a scratch vCPU.
// IA32_TSC_DEADLINE, when present, is last (restored after IA32_TSC).
const std::vector<uint32_t>& snapshot_msrs(const KvmSystem& sys);

void save_vcpu(const KvmSystem& sys, const KvmVm& vm, KvmVcpu& vcpu, StateWriter& out);

// The guest TSC offset the first restored vCPU got: every later vCPU of the
// machine takes the same one, so their TSCs stay as synchronised as they were.
struct RestoredTsc {
  bool have_offset = false;
  uint64_t offset = 0;
};
// Throws SNAPSHOT_INVALID on a malformed blob, SNAPSHOT_INCOMPATIBLE when KVM
// refuses the state (another host), INTERNAL on other KVM failures. vCPUs are
// restored in index order with one RestoredTsc per machine.
void restore_vcpu(const KvmSystem& sys, KvmVcpu& vcpu, StateReader& in, RestoredTsc& tsc);
// Before the vCPU runs again: tells the guest's kvmclock it was paused
// (no soft-lockup warnings). Ignored where the guest has no kvmclock.
void notify_clock_paused(KvmVcpu& vcpu);

// Named parts of a saved vCPU or VM state (tests and diagnostics compare
// them across a round trip): "regs", "sregs", "lapic", "msr.0x10", ...
using StateParts = std::vector<std::pair<std::string, std::vector<uint8_t>>>;
void describe_vcpu(StateReader& in, const std::string& prefix, StateParts& out);
void describe_vm(StateReader& in, StateParts& out);

void save_vm(KvmVm& vm, StateWriter& out);
void restore_vm(KvmVm& vm, StateReader& in);

}  // namespace torpor::x86
