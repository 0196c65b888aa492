// A virtual machine: KVM VM + RAM + devices + one thread per vCPU + one I/O
// thread, with a lifecycle the addon exposes as promises.
//
// States: Created -> Running -> Pausing -> Paused -> Running ... -> Stopped |
// Failed. Pausing: the vCPUs were told to leave KVM_RUN; Paused: every vCPU
// is parked and every device quiesced on the I/O thread (no device touches
// guest memory or raises an interrupt until resume() re-arms them). The guest ends
// a machine from a vCPU thread (reset, triple fault, emulation failure...);
// the host ends it with stop(). Either way exactly one exit notification is
// delivered, after every vCPU thread has left KVM_RUN for good and the I/O
// thread has stopped.
//
// Asynchronous operations (start, pause) complete through a Done callback
// called on whichever native thread finished them (a vCPU thread, or the
// caller's when there was nothing to wait for). Callbacks never block.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "devices/bus.h"
#include "devices/virtio/blk/blk_options.h"
#include "devices/virtio/net/egress_policy.h"
#include "devices/virtio/net/net_options.h"
#include "devices/virtio/virtio_mmio.h"
#include "devices/virtio/vsock/vsock_host.h"
#include "vmm/console.h"
#include "base/event_loop.h"
#include "vmm/guest_ram.h"
#include "vmm/host_probe.h"
#include "vmm/irq_line.h"
#include "vmm/kick_signal.h"
#include "vmm/kvm.h"
#include "vmm/vcpu.h"

namespace torpor {

class Serial8250;
class I8042;
class SeccompTestPort;

struct MachineConfig {
  std::string kernel;
  std::string initrd;
  std::string cmdline;
  uint32_t vcpus = 2;
  uint64_t memory_mib = 512;
  std::vector<BlkOptions> disks;
  std::optional<uint64_t> vsock_cid;
  // Host ports a guest knocks on (VsockHost::set_knock_ports). Not part of a
  // snapshot's spec: the guest knocks once, at boot (docs/protocol.md).
  std::vector<uint32_t> vsock_knock_ports;
  bool rng = false;
  // virtio-net (the last virtio device). A snapshot keeps the MAC; the
  // backend socket is per run (a restored machine gets net_attach()).
  std::optional<NetOptions> net;
  std::string console_log;
  size_t console_ring_bytes = 64 * 1024;
  std::string kvm_device = "/dev/kvm";
};

enum class MachineState { Created, Running, Pausing, Paused, Stopped, Failed };
const char* machine_state_name(MachineState s);

struct ExitReason {
  std::string kind;
  std::string message;
  std::string console_tail;
};

// What machine.capture() wrote.
struct CaptureResult {
  uint64_t generation = 0;
  uint64_t bytes = 0;        // bytes written (memory layer, state file, disk layers as allocated: they are sparse)
  uint64_t dirty_pages = 0;  // pages written since the previous generation (all of RAM's nonzero pages for a full layer)
  bool full_layer = false;
  // Per disk: its frozen layers as the generation names them, oldest first
  // (relative to the directory when inside it, else absolute): what a boot
  // from this generation's disk stacks, and what older generations' files
  // are still needed for.
  std::vector<std::vector<std::string>> disk_layers;
  // The generation's own files, relative to the directory (names from
  // snapshot/generation_layout.h), and its memory chain bottom first (this
  // generation's layer last; absolute for another directory's layers).
  std::string state_file, memory_layer, manifest;
  std::vector<std::string> memory_layers;
  double captured_ms = 0;    // state and dirty pages read (the machine could continue from here)
  double durable_ms = 0;     // the generation is on disk and `current` points at it
};

struct RestorePlan;  // machine_snapshot.cc

struct MachineStats {
  uint64_t exits = 0, pio_exits = 0, mmio_exits = 0, halt_exits = 0;
  uint64_t create_to_first_run_ns = 0;
  uint64_t create_to_first_exit_ns = 0;  // first PIO/MMIO exit: the guest ran its first instructions
  // The same first exit on CLOCK_MONOTONIC (Node's process.hrtime): a caller
  // times "its call -> the guest's first exit" across threads. 0: none yet.
  uint64_t first_exit_at_ns = 0;
  // Where building (create or restore) spent its time, phase by phase, in
  // order (ms): restore's state file, memory chain, VM, RAM, irqchip...
  std::vector<std::pair<std::string, double>> build_phases;
};

// Times the phases of a machine's construction (cheap: a clock read each).
class PhaseClock {
 public:
  PhaseClock() : last_(std::chrono::steady_clock::now()) {}
  explicit PhaseClock(std::chrono::steady_clock::time_point since) : last_(since) {}
  void mark(const char* name) {
    auto now = std::chrono::steady_clock::now();
    phases_.emplace_back(name, std::chrono::duration<double, std::milli>(now - last_).count());
    last_ = now;
  }
  const std::vector<std::pair<std::string, double>>& phases() const { return phases_; }

 private:
  std::chrono::steady_clock::time_point last_;
  std::vector<std::pair<std::string, double>> phases_;
};

class Machine final : private VcpuHost {
 public:
  // code == nullptr: success.
  using Done = std::function<void(const char* code, const std::string& message)>;
  struct Callbacks {
    std::function<void()> console_pending;  // Console has bytes to take
    std::function<void(MachineState, const ExitReason&)> exited;
    std::function<void()> vsock_knocked;  // the guest knocked on a knock port (I/O thread, no lock held)
  };

  // Builds the VM, loads the kernel, creates devices and vCPUs; no thread
  // runs yet. Throws torpor::Error (KVM_UNAVAILABLE, BOOT_FAILED, ...).
  Machine(const MachineConfig& cfg, Callbacks callbacks);
  ~Machine() override;  // stop()s

  // Rebuilds a machine from the generation `current` points at in `dir`
  // (validated before KVM is touched: SNAPSHOT_INVALID, SNAPSHOT_INCOMPATIBLE).
  // Guest RAM maps the bottom memory layer MAP_PRIVATE and reads the diffs
  // into place. Nothing runs until start(). Blocking: not on the JS thread.
  // `into` (another directory, e.g. a sandbox's from a read-only template):
  // the machine's disk tops go there and it continues as if `into` held its
  // generation 0 (its chain names dir's layers by absolute path), so its
  // first capture into `into` is a diff. Nothing is written into `dir`.
  // `disk_bytes[i]` (0 or absent: as saved) grows disk i on the way: its new
  // top overlay takes that size, the layers below keep theirs, and the
  // guest's driver is told of the new capacity (a virtio config change) when
  // it runs. Smaller than saved, not a multiple of 512 or a read-only disk:
  // Error(INVALID_ARGUMENT), a disk never shrinks.
  static std::unique_ptr<Machine> restore(const std::string& dir, Callbacks callbacks, const std::string& into = {},
                                          const std::vector<uint64_t>& disk_bytes = {});
  // Writes a new generation into `dir` (generation directory, fsynced, then
  // `current` switched atomically). The machine must be Paused (vCPUs out of
  // KVM_RUN, devices quiesced) and stays so. A full memory layer the first
  // time into a directory, then diff layers of the pages written since.
  // Blocking (disk writes, fdatasync): a worker thread only.
  // on_captured runs (on the calling thread) once the state and the memory
  // to write are copied out: from then on the machine may run again
  // (resume() is safe there) while the generation is made durable.
  CaptureResult capture(const std::string& dir, const std::function<void()>& on_captured = {});
  // Pages written since the last generation, by the guest or by the devices
  // (reads KVM's dirty log; nothing is lost for the next capture).
  uint64_t dirty_page_count();
  // The same pages as a bitmap (bit i: RAM's linear page i), nothing cleared.
  std::vector<uint64_t> dirty_page_bitmap();
  // The state a capture would save, as named parts (vm.pit, vcpu0.regs,
  // vcpu0.msr.0x10, dev.<name>@<base>, ...): round-trip tests compare them.
  // Paused machines only.
  std::vector<std::pair<std::string, std::vector<uint8_t>>> state_parts();
  // The same parts as saved in the generation `current` names in `dir`
  // (validated as a restore validates it). Reads one small file.
  static std::vector<std::pair<std::string, std::vector<uint8_t>>> snapshot_parts(const std::string& dir);

  void start(Done done, bool paused = false);   // Created -> Running (or Paused); done once every vCPU entered KVM_RUN (or parked)
  void pause(Done done);   // Running -> Pausing -> Paused; done once every vCPU is parked and every device quiesced
  void resume();           // Pausing | Paused -> Running (devices re-armed)
  // Ends the machine (reason 'stop' unless the guest ended it first), joins
  // every thread. Idempotent; safe from any thread except a vCPU or I/O thread.
  ExitReason stop();
  // stop()s, then gives back what the machine holds: vCPUs, devices (and
  // their files), the I/O thread's fds, guest RAM, the VM and KVM fds. What
  // stays answers state(), exit_reason(), stats(), kernel_cmdline() and the
  // console's tail. Idempotent; same threads as stop(). Done at stop time,
  // not at garbage collection, so a process that creates and stops machines
  // in a loop stays flat (test/vmm-lifecycle.test.ts). The kernel's VM
  // teardown (slow) goes to the reaper thread (vmm/reaper.h) unless
  // defer_kvm is false (environment cleanup: all gone before it returns).
  // Returns the exit reason (as stop() does).
  ExitReason release(bool defer_kvm = true);
  bool released() const { return released_.load(); }

  // `count` restores of this machine's snapshots are coming (a fork): VM
  // shells for them are built ahead where the pool keeps this size.
  void prepare_restores(size_t count);

  MachineState state() const;
  std::optional<ExitReason> exit_reason() const;
  MachineStats stats() const;
  std::string kernel_cmdline() const { return cmdline_; }

  Console& console() { return *console_; }  // kept by release()
  // Serial input; returns bytes accepted. INVALID_STATE once released.
  size_t console_input(const uint8_t* data, size_t len);
  // The accessors below throw INVALID_STATE once the machine is released.
  GuestMemory& memory() { return require(ram_, "guest memory")->memory(); }
  VsockHost* vsock() { return released() ? nullptr : vsock_host_; }
  // Connects the network device to a new backend (passt's Unix socket),
  // replacing the old one. INVALID_STATE without a network device or once
  // released; NET_BACKEND when the socket cannot be connected. Not on the
  // I/O thread.
  void net_attach(const std::string& socket_path);
  // The same over a new socketpair: returns the other end, which the caller
  // owns and hands to the backend process (passt --fd).
  int net_attach_pair();
  // Attaches the device to `fd` (a connected stream socket; ownership passes
  // here, closed on failure too).
  void net_attach_fd(int fd);
  // What the guest may send (egress off: see devices/virtio/net/egress_policy.h).
  void net_set_egress_policy(EgressPolicy policy);
  // Why the network backend died ("" while it lives or with no device).
  std::string net_backend_error();

  // Every device in platform order: serial, i8042, then the virtio devices
  // (disks, vsock, rng, net), each paired with its bus base address.
  std::vector<std::pair<uint64_t, BusDevice*>> devices();

 private:
  Machine(const MachineConfig& cfg, Callbacks callbacks, RestorePlan* plan);
  static std::unique_ptr<Machine> restore_from(const std::string& dir, Callbacks callbacks, const std::string& into,
                                               const std::vector<uint64_t>& disk_bytes);
  CaptureResult capture_locked(const std::string& dir, const std::function<void()>& on_captured);
  void load_state(RestorePlan& plan);
  void vcpu_pio(uint16_t port, uint8_t* data, size_t len, bool is_write) override;
  void vcpu_mmio(uint64_t addr, uint8_t* data, size_t len, bool is_write) override;
  void vcpu_entered(uint32_t index) override;
  void vcpu_parked(uint32_t index, uint64_t pause_seq) override;
  void vcpu_guest_ended(uint32_t index, bool failed, const std::string& kind, const std::string& message) override;
  void vcpu_exited(uint32_t index) override;

  template <typename T>
  T* require(const std::unique_ptr<T>& p, const char* what) const {
    if (!p) throw Error(code::kInvalidState, std::string("the machine was stopped and its ") + what + " released");
    return p.get();
  }
  ExitReason stop_locked();  // stop_mu_ held
  MachineStats collect_stats() const;

  void add_virtio(std::unique_ptr<VirtioMmioDevice> dev, std::unique_ptr<KvmIrqLine> irq);
  VirtioMmioDevice& net_device();  // INVALID_STATE once released or without one
  // Called once all vCPU threads are gone: stops the I/O thread, fixes the
  // final state, fires pending completions and the exit callback.
  void finish();
  void end_locked(bool failed, const std::string& kind, const std::string& message);

  Callbacks callbacks_;
  std::chrono::steady_clock::time_point created_at_;
  KickSignalRef kick_ref_;
  HostKind host_kind_;
  std::unique_ptr<KvmSystem> kvm_;
  std::unique_ptr<KvmVm> vm_;
  std::unique_ptr<GuestRam> ram_;
  std::unique_ptr<EventLoop> loop_;
  std::unique_ptr<Console> console_;
  Bus pio_bus_, mmio_bus_;
  std::unique_ptr<KvmIrqLine> serial_irq_;
  std::unique_ptr<Serial8250> serial_;
  std::unique_ptr<I8042> i8042_;
  struct VirtioSlot {
    std::unique_ptr<KvmIrqLine> irq;
    std::unique_ptr<VirtioMmioDevice> dev;
    std::vector<Fd> notify_fds;
    uint64_t base;
  };
  std::vector<VirtioSlot> virtio_;
  VsockHost* vsock_host_ = nullptr;
  VirtioMmioDevice* net_dev_ = nullptr;  // in virtio_, when configured
  std::vector<std::unique_ptr<Vcpu>> vcpus_;
  std::string cmdline_;

  // Serialises stop() and release(): two threads joining the same vCPU
  // thread (a JS thread and the atexit handler) would be undefined behaviour.
  std::mutex stop_mu_;
  std::atomic<bool> released_{false};
  MachineStats final_stats_;  // stats() after release()
  // Guards vcpus_ against release() moving it away while stats() reads the
  // counters (stop and release may run on a worker thread).
  mutable std::mutex vcpus_mu_;

  mutable std::mutex mu_;
  MachineState state_ = MachineState::Created;
  bool ending_ = false;    // an end was decided (reason_ set)
  bool finished_ = false;  // finish() ran
  bool threads_started_ = false;
  ExitReason reason_;
  bool failed_ = false;
  uint32_t entered_ = 0, parked_ = 0, exited_ = 0;
  uint64_t pause_seq_ = 0;  // Pause commands sent to every vCPU so far
  std::vector<Done> start_waiters_, pause_waiters_;
  std::atomic<uint64_t> first_run_ns_{0};
  std::atomic<uint64_t> first_exit_ns_{0};
  std::vector<std::pair<std::string, double>> build_phases_;  // set by the constructor
  void note_first_exit();
  // seccomp (vmm/thread_seccomp.h): whether this machine's threads install
  // their filters, the eventfd the I/O thread's SIGSYS handler writes, and
  // the test port (vmm/seccomp_test_port.h), on the port bus only when
  // TORPOR_SECCOMP_TEST_HOOK asked for it.
  bool seccomp_ = false;
  std::unique_ptr<SeccompTestPort> seccomp_test_port_;
  Fd seccomp_notify_;
  void watch_io_thread_violations();
  void io_thread_started();
  // On the I/O thread, once the vCPUs of pause number `seq` are all parked.
  void quiesce_devices(uint64_t seq);
  void set_devices_quiesced(bool quiesced);

  // Snapshot bookkeeping (capture and restore hold stop_mu_).
  MachineConfig config_;                 // what the machine was built from (the snapshot's spec)
  std::vector<uint64_t> dirty_;          // pages written since the last generation (linear page index)
  std::vector<uint8_t> capture_buf_;     // dirty pages copied out by the last captures (reused)
  std::string snapshot_dir_;             // where the last generation was written or read
  std::vector<std::string> mem_chain_;   // its memory layers, bottom first, relative to snapshot_dir_ (or absolute)
  uint64_t generation_ = 0;
  bool restored_ = false;
  // Layer merges running off the capture path (at most one job; machine_merge.cc).
  struct LayerMerge {
    std::thread thread;
    std::atomic<bool> done{false};    // set by the thread when it is through
    std::atomic<bool> cancel{false};  // a stop: give up between chunks
    std::string dir;                  // snapshot_dir_ when it started
    // Memory: mem_chain_[mem_first, mem_first + mem_layers) into mem_merged (relative to
    // dir): a diff over mem_chain_[mem_first - 1], or a full layer when mem_first is 0.
    bool memory = false, memory_ok = false;
    size_t mem_first = 0, mem_layers = 0;
    std::string mem_merged;
    std::vector<std::string> mem_paths;
    uint64_t ram_bytes = 0;
    // A disk: frozen_overlays[first, first + layers.size()) into merged.
    struct DiskPart {
      size_t disk = 0, first = 0;
      std::vector<std::string> layers;
      std::string merged;  // as config_ names layers (under dir)
      uint64_t size = 0;
      bool ok = false;     // written by the thread before disks_done passes it; false again once adopted
    };
    std::vector<DiskPart> disks;        // not resized once the thread runs
    std::atomic<size_t> disks_done{0};  // disks[0, disks_done) are through (ok says how)
  };
  std::unique_ptr<LayerMerge> merge_;
  void start_merges();            // stop_mu_ held
  bool merge_due() const;         // stop_mu_ held: a capture must wait for the job in flight
  void adopt_merges(bool wait);   // stop_mu_ held, machine paused: takes the disks merged so far, and a finished (or, with wait, any) job
  void drop_merge();              // cancels and joins the job, removes what it wrote and nobody adopted
  std::once_flag finish_once_;
};

}  // namespace torpor
