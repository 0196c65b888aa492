#include "vmm/vcpu.h"

#include <sys/ioctl.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "vmm/kick_signal.h"
#include "vmm/thread_seccomp.h"

namespace torpor {

namespace {

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof(b), "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace

Vcpu::Vcpu(std::unique_ptr<KvmVcpu> kvm, VcpuHost& host) : kvm_(std::move(kvm)), host_(host) {}

Vcpu::~Vcpu() {
  send(Command::Stop);
  join();
}

void Vcpu::start(Command first, bool seccomp) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    want_ = first;
  }
  seccomp_ = seccomp;
  thread_ = std::thread([this] { thread_main(); });
}

void Vcpu::send(Command c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (want_ == Command::Stop) return;  // Stop is final
    want_ = c;
    if (c == Command::Pause) pause_seq_++;
  }
  cv_.notify_all();
  if (c != Command::Run && thread_.joinable()) {
    __atomic_store_n(&kvm_->run()->immediate_exit, 1, __ATOMIC_SEQ_CST);
    kick_thread(thread_.native_handle());
  }
}

void Vcpu::join() {
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool Vcpu::run_once(bool* interrupted) {
  *interrupted = false;
  int r = ::ioctl(kvm_->fd(), KVM_RUN, 0);
  io_pending_ = false;  // any return from KVM_RUN completed the previous exit
  if (r < 0) {
    if (errno == EINTR || errno == EAGAIN) {
      *interrupted = true;
      return true;
    }
    host_.vcpu_guest_ended(index(), true, "internal-error", std::string("KVM_RUN failed: ") + std::strerror(errno));
    return false;
  }
  counters_.exits.fetch_add(1, std::memory_order_relaxed);
  return handle_exit();
}

bool Vcpu::complete_pending_io() {
  while (io_pending_) {
    __atomic_store_n(&kvm_->run()->immediate_exit, 1, __ATOMIC_SEQ_CST);
    bool interrupted;
    if (!run_once(&interrupted)) return false;
  }
  return true;
}

void Vcpu::thread_main() {
  kvm_run* run = kvm_->run();
  kick_accept_on_this_thread();
  // Named so a test (and a debugger) can tell that no vCPU thread outlived its machine.
  char name[16];
  std::snprintf(name, sizeof(name), "torpor-vcpu%u", index());
  pthread_setname_np(pthread_self(), name);
  bool entered = false, alive = true;
  if (seccomp_) {
    try {
      seccomp_enter(ThreadRole::Vcpu);
    } catch (const std::exception& e) {
      host_.vcpu_guest_ended(index(), true, "internal-error",
                             std::string("vCPU ") + std::to_string(index()) + " could not install its seccomp filter: " +
                                 e.what() + " (TORPOR_SECCOMP=off runs without)");
      alive = false;
    }
  }
  uint64_t acked_seq = 0;
  while (alive) {
    // A call outside the allow-list was refused (it returned EPERM to the
    // code that made it); the machine ends here, the process goes on.
    if (seccomp_) {
      int nr = seccomp_violation();
      if (nr >= 0) {
        host_.vcpu_guest_ended(index(), true, "seccomp-violation",
                               "vCPU " + std::to_string(index()) + " thread made " + seccomp_describe(nr) +
                                   ", outside its seccomp allow-list (docs/seccomp.md)");
        break;
      }
    }
    // Clear the kick flag before reading the mailbox: a command sent after
    // this point either is seen below or sets the flag again.
    __atomic_store_n(&run->immediate_exit, 0, __ATOMIC_SEQ_CST);
    Command cmd;
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cmd = want_;
      seq = pause_seq_;
    }
    if (cmd == Command::Stop) break;
    if (cmd == Command::Pause) {
      if (io_pending_) {
        alive = complete_pending_io();
        continue;
      }
      if (acked_seq != seq) {
        acked_seq = seq;
        host_.vcpu_parked(index(), seq);
      }
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return want_ != Command::Pause || pause_seq_ != acked_seq; });
      continue;
    }
    if (!entered) {
      entered = true;
      host_.vcpu_entered(index());
    }
    bool interrupted;
    // An exception escaping a std::thread ends the process (std::terminate):
    // a device that throws on a port or MMIO access ends the machine instead.
    try {
      alive = run_once(&interrupted);
    } catch (const std::exception& e) {
      host_.vcpu_guest_ended(index(), true, "internal-error",
                             std::string("device error on vCPU ") + std::to_string(index()) + ": " + e.what());
      alive = false;
    }
  }
  host_.vcpu_exited(index());
}

bool Vcpu::handle_exit() {
  kvm_run* run = kvm_->run();
  switch (run->exit_reason) {
    case KVM_EXIT_IO: {
      counters_.pio.fetch_add(1, std::memory_order_relaxed);
      auto& io = run->io;
      size_t size = io.size;
      // data_offset and count come from the kernel; still bound them to the
      // kvm_run mapping before touching it.
      if (size == 0 || size > 4 || io.data_offset + uint64_t{io.count} * size > kvm_->run_size()) {
        host_.vcpu_guest_ended(index(), true, "internal-error", "malformed PIO exit");
        return false;
      }
      uint8_t* data = reinterpret_cast<uint8_t*>(run) + io.data_offset;
      for (uint32_t i = 0; i < io.count; i++)
        host_.vcpu_pio(io.port, data + i * size, size, io.direction == KVM_EXIT_IO_OUT);
      io_pending_ = true;
      return true;
    }
    case KVM_EXIT_MMIO: {
      counters_.mmio.fetch_add(1, std::memory_order_relaxed);
      auto& m = run->mmio;
      size_t len = m.len > 8 ? 8 : m.len;
      host_.vcpu_mmio(m.phys_addr, m.data, len, m.is_write != 0);
      io_pending_ = true;
      return true;
    }
    case KVM_EXIT_HLT:
      // Only without an in-kernel LAPIC; ours has one, so this is a guest
      // that halted for good.
      counters_.hlt.fetch_add(1, std::memory_order_relaxed);
      host_.vcpu_guest_ended(index(), false, "hlt", "vCPU " + std::to_string(index()) + " halted");
      return false;
    case KVM_EXIT_SHUTDOWN:
      host_.vcpu_guest_ended(index(), true, "triple-fault",
                             "vCPU " + std::to_string(index()) + " shut down (triple fault)");
      return false;
    case KVM_EXIT_FAIL_ENTRY:
      host_.vcpu_guest_ended(index(), true, "internal-error",
                             "VM entry failed on vCPU " + std::to_string(index()) + " (hardware reason " +
                                 hex(run->fail_entry.hardware_entry_failure_reason) + ")");
      return false;
    case KVM_EXIT_INTERNAL_ERROR: {
      auto& ie = run->internal;
      bool emulation = ie.suberror == KVM_INTERNAL_ERROR_EMULATION;
      std::string msg = std::string(emulation ? "instruction emulation failed" : "KVM internal error") + " on vCPU " +
                        std::to_string(index()) + " (suberror " + std::to_string(ie.suberror);
      for (uint32_t i = 0; i < ie.ndata && i < 4; i++) msg += (i ? ", " : "; data ") + hex(ie.data[i]);
      msg += ")";
      host_.vcpu_guest_ended(index(), true, emulation ? "emulation-failure" : "internal-error", msg);
      return false;
    }
    case KVM_EXIT_SYSTEM_EVENT: {
      uint32_t type = run->system_event.type;
      if (type == KVM_SYSTEM_EVENT_RESET)
        host_.vcpu_guest_ended(index(), false, "reset", "the guest reset the machine");
      else if (type == KVM_SYSTEM_EVENT_SHUTDOWN)
        host_.vcpu_guest_ended(index(), false, "poweroff", "the guest powered the machine off");
      else if (type == KVM_SYSTEM_EVENT_CRASH)
        host_.vcpu_guest_ended(index(), true, "panic", "the guest reported a crash");
      else
        host_.vcpu_guest_ended(index(), true, "internal-error", "system event " + std::to_string(type));
      return false;
    }
    case KVM_EXIT_INTR:
      return true;
    default:
      host_.vcpu_guest_ended(index(), true, "internal-error",
                             "unexpected KVM exit " + std::to_string(run->exit_reason) + " on vCPU " +
                                 std::to_string(index()));
      return false;
  }
}

}  // namespace torpor
