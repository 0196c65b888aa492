// One vCPU and the thread that runs it.
//
// The thread is driven by messages (Run, Pause, Stop) in a one-slot mailbox:
// the latest command wins. Sending a command kicks the thread out of KVM_RUN
// with immediate_exit plus the process-wide kick signal (kick_signal.h).
// Before acknowledging a pause the thread completes any PIO/MMIO exit it just
// handled (a KVM_RUN with immediate_exit = 1 finishes the instruction and
// returns at once), so a paused vCPU's state is whole and can be saved.
//
// Exits are dispatched through VcpuHost (the machine): port and memory
// accesses to its buses, and the end of the machine (triple fault, internal
// error, emulation failure...) reported as a reason.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "vmm/kvm.h"

namespace torpor {

class VcpuHost {
 public:
  virtual ~VcpuHost() = default;
  // Port I/O and MMIO; data holds len bytes (written by a read).
  virtual void vcpu_pio(uint16_t port, uint8_t* data, size_t len, bool is_write) = 0;
  virtual void vcpu_mmio(uint64_t addr, uint8_t* data, size_t len, bool is_write) = 0;
  // The thread is about to enter KVM_RUN for the first time.
  virtual void vcpu_entered(uint32_t index) = 0;
  // The thread acknowledged a Pause: it is out of KVM_RUN with no I/O pending.
  // pause_seq counts the Pause commands this vCPU was sent (1 for the first):
  // an acknowledgement of an older pause can arrive after a newer one began.
  virtual void vcpu_parked(uint32_t index, uint64_t pause_seq) = 0;
  // The guest ended the machine from this vCPU (kind per NativeExitReason).
  virtual void vcpu_guest_ended(uint32_t index, bool failed, const std::string& kind, const std::string& message) = 0;
  // The thread is leaving (after a Stop, or after reporting an end).
  virtual void vcpu_exited(uint32_t index) = 0;
};

struct VcpuCounters {
  std::atomic<uint64_t> exits{0};
  std::atomic<uint64_t> pio{0};
  std::atomic<uint64_t> mmio{0};
  std::atomic<uint64_t> hlt{0};
};

class Vcpu {
 public:
  enum class Command { Run, Pause, Stop };

  Vcpu(std::unique_ptr<KvmVcpu> kvm, VcpuHost& host);
  ~Vcpu();  // stops and joins
  Vcpu(const Vcpu&) = delete;
  Vcpu& operator=(const Vcpu&) = delete;

  KvmVcpu& kvm() { return *kvm_; }
  uint32_t index() const { return kvm_->index(); }
  const VcpuCounters& counters() const { return counters_; }

  // Spawns the thread. With seccomp, the thread installs the vCPU allow-list
  // (vmm/thread_seccomp.h) before anything else and ends the machine
  // ('seccomp-violation') at the first call outside it.
  void start(Command first, bool seccomp = false);
  void send(Command c);       // any thread; idempotent
  void join();                // after send(Stop); any thread but this vCPU's own

 private:
  void thread_main();
  // Handles the exit in kvm_run; false when the machine must end.
  bool handle_exit();
  // KVM_RUN with immediate_exit = 1 until the pending I/O is complete.
  bool complete_pending_io();
  bool run_once(bool* interrupted);

  std::unique_ptr<KvmVcpu> kvm_;
  VcpuHost& host_;
  VcpuCounters counters_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  Command want_ = Command::Pause;
  uint64_t pause_seq_ = 0;   // bumped by every Pause: each one is acknowledged once
  bool io_pending_ = false;  // thread-local state, only touched by the thread
  bool seccomp_ = false;     // set before the thread starts
};

}  // namespace torpor
