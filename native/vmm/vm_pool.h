// VM shells built ahead for restores: KVM_CREATE_VM, TSS and identity map,
// guest RAM slots, KVM_CREATE_IRQCHIP and KVM_CREATE_PIT2, ready before a
// restore asks for them.
//
// Why: rebuilding the VM is most of a restore on PVM (measured, 512 MiB test
// guest: KVM_CREATE_PIT2 2-58 ms, it starts a kernel worker thread and waits
// for it; the rest of the restore ~1 ms). The RAM slots are part of the shell
// because a slot registered after KVM_CREATE_IRQCHIP costs ~7.5 ms on PVM
// instead of ~0.3: the shell registers anonymous, never-touched RAM, and a
// restore maps its memory layer over it (MAP_FIXED, same addresses: the
// slots stay valid, KVM's MMU notifier drops nothing since nothing was
// faulted in).
//
// Bounded: shells are kept for the RAM sizes of the two most recent
// restores, `depth` of each (TORPOR_RESTORE_POOL, default 2, 0 turns the
// pool off, at most 16). An idle shell holds two fds (/dev/kvm, the VM), the
// kernel's VM, irqchip and PIT (a kernel thread, not one of this process's),
// and a NORESERVE mapping of the RAM size that costs no memory until used.
// Shells are built on one process-wide thread, never on a restore's path;
// the process's exit closes whatever is idle (the kernel tears the VMs down).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "vmm/guest_ram.h"
#include "vmm/kvm.h"

namespace torpor {

struct VmShell {
  std::unique_ptr<KvmSystem> kvm;
  std::unique_ptr<KvmVm> vm;
  std::unique_ptr<GuestRam> ram;  // anonymous, registered before the irqchip
};

class PhaseClock;
// Builds a shell now, on the calling thread; `clock` (optional) times each call.
std::unique_ptr<VmShell> build_vm_shell(const std::string& device, uint64_t ram_bytes, PhaseClock* clock = nullptr);
// A shell built ahead for (device, ram_bytes), or nullptr; either way the pool
// thread is asked to build what this size lacks.
std::unique_ptr<VmShell> take_vm_shell(const std::string& device, uint64_t ram_bytes);
// `count` restores of this size are about to come at once (a fork): shells
// beyond the depth are built for them (at most 16 in all), once, for a size
// the pool already keeps (the pool fills only for sizes restored before).
void vm_pool_reserve(const std::string& device, uint64_t ram_bytes, size_t count);
// Idle shells of every size are dropped (their teardown goes to the reaper);
// the pool refills only on the next restore.
void vm_pool_clear();
// Idle shells now (tests, benchmarks).
size_t vm_pool_idle();
// Shells kept per RAM size (0: off, idle shells dropped); capped at 16.
size_t vm_pool_depth();
void vm_pool_set_depth(size_t depth);

}  // namespace torpor
