// RAII wrappers over the three kinds of KVM file descriptor: the system
// (/dev/kvm), a VM and a vCPU (with its mmap'ed kvm_run page).
//
// Each wrapper throws torpor::Error on failure and never aborts. They are
// thin on purpose: machine setup (native/vmm/machine.cc, x86_64/) decides
// what to call and in which order; these only make the calls safe to hold.
#pragma once

#include <linux/kvm.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/fd.h"

namespace torpor {

// Every KVM ioctl but KVM_RUN goes through here: retried on EINTR and counted
// process-wide, so the benchmarks can say how many KVM calls a path makes
// (kvm_call_count before and after; a statistic, no machine's state).
int kvm_ioctl(int fd, unsigned long req, unsigned long arg);
uint64_t kvm_call_count();

// Capability numbers newer than bookworm's <linux/kvm.h>.
#ifndef KVM_CAP_PRE_FAULT_MEMORY
#define KVM_CAP_PRE_FAULT_MEMORY 236
#endif

class KvmSystem {
 public:
  // Opens the device read/write. Throws KVM_UNAVAILABLE with the reason
  // (missing device, no permission, wrong API version).
  explicit KvmSystem(const std::string& path = "/dev/kvm");

  int fd() const { return fd_.get(); }
  int api_version() const { return api_version_; }
  // KVM_CHECK_EXTENSION on the system fd: 0 when absent, else its value.
  int check_extension(long cap) const;
  size_t vcpu_mmap_size() const;
  // KVM_GET_SUPPORTED_CPUID (grown until it fits).
  std::vector<kvm_cpuid_entry2> supported_cpuid() const;
  // KVM_GET_MSR_INDEX_LIST: the MSRs KVM saves and restores.
  std::vector<uint32_t> msr_index_list() const;

 private:
  Fd fd_;
  int api_version_ = 0;
};

class KvmVm {
 public:
  explicit KvmVm(const KvmSystem& sys);
  int fd() const { return fd_.get(); }
  int check_extension(long cap) const;

  void set_tss_addr(uint64_t addr);
  void set_identity_map_addr(uint64_t addr);
  void create_irqchip();
  void create_pit2();
  void set_user_memory_region(uint32_t slot, uint64_t gpa, uint64_t size, void* host, uint32_t flags);
  // KVM_GET_DIRTY_LOG of a slot logging dirty pages: ORs the pages the guest
  // wrote since the last call into `bitmap` (one bit per page; bitmap sized
  // for the slot, rounded up to 64 pages) and clears KVM's copy.
  void get_dirty_log(uint32_t slot, std::vector<uint64_t>& bitmap);
  // KVM_IRQ_LINE: level of a GSI.
  void irq_line(uint32_t gsi, bool level);
  // Binds an eventfd to a GSI (edge: every write is one interrupt).
  void irqfd(int event_fd, uint32_t gsi);
  void irqfd_remove(int event_fd, uint32_t gsi);
  // An eventfd signalled by guest writes of `len` bytes of `datamatch` to `addr`
  // (MMIO; no exit to userspace).
  void ioeventfd(int event_fd, uint64_t addr, uint32_t len, uint64_t datamatch);
  void ioeventfd_remove(int event_fd, uint64_t addr, uint32_t len, uint64_t datamatch);

 private:
  Fd fd_;
};

class KvmVcpu {
 public:
  KvmVcpu(const KvmSystem& sys, const KvmVm& vm, uint32_t index);
  ~KvmVcpu();
  KvmVcpu(const KvmVcpu&) = delete;
  KvmVcpu& operator=(const KvmVcpu&) = delete;

  int fd() const { return fd_.get(); }
  kvm_run* run() const { return run_; }
  size_t run_size() const { return run_size_; }
  uint32_t index() const { return index_; }

  // Plain ioctl on the vCPU fd, throwing INTERNAL with `what` on failure.
  void ioctl_or_throw(unsigned long request, void* arg, const char* what) const;
  void set_cpuid(const std::vector<kvm_cpuid_entry2>& entries);
  // KVM_SET_MSRS; returns how many were set (KVM stops at the first refused one).
  size_t set_msrs(const std::vector<std::pair<uint32_t, uint64_t>>& msrs);
  // KVM_GET_MSRS of one MSR; false when KVM refused it.
  bool get_msr(uint32_t index, uint64_t* value);

 private:
  Fd fd_;
  kvm_run* run_ = nullptr;
  size_t run_size_ = 0;
  uint32_t index_;
};

}  // namespace torpor
