#include "vmm/machine.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <system_error>
#include <thread>

#include "common/error.h"
#include "devices/i8042/i8042.h"
#include "devices/virtio/blk/make_blk.h"
#include "devices/virtio/net/make_net.h"
#include "devices/virtio/rng/make_rng.h"
#include "devices/virtio/vsock/make_vsock.h"
#include "devices/serial/serial_8250.h"
#include "snapshot/disk_layers.h"
#include "vmm/machine_snapshot.h"
#include "vmm/reaper.h"
#include "vmm/seccomp_test_port.h"
#include "vmm/thread_seccomp.h"
#include "vmm/vm_pool.h"
#include "vmm/x86_64/boot.h"
#include "vmm/x86_64/cpuid.h"
#include "vmm/x86_64/layout.h"
#include "vmm/x86_64/vcpu_init.h"
#include "vmm/x86_64/xstate.h"

namespace torpor {

namespace {

constexpr size_t kExitTailBytes = 4096;
constexpr uint64_t kMinMemoryMiB = 2;
constexpr uint64_t kMaxMemoryMiB = 1024 * 1024;

uint64_t now_ns(std::chrono::steady_clock::time_point since) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since).count());
}

// Physical RAM of the host (0 when unknown).
uint64_t host_ram_mib() {
  long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) / x86::kMiB : 0;
}

void validate(const MachineConfig& cfg, int max_vcpus) {
  if (cfg.kernel.empty()) throw Error(code::kInvalidArgument, "kernel path is required");
  uint32_t limit = std::min<uint32_t>(254, max_vcpus > 0 ? static_cast<uint32_t>(max_vcpus) : 254);
  if (cfg.vcpus < 1 || cfg.vcpus > limit)
    throw Error(code::kInvalidArgument, "vcpus must be 1.." + std::to_string(limit) + " on this host");
  if (cfg.memory_mib < kMinMemoryMiB || cfg.memory_mib > kMaxMemoryMiB)
    throw Error(code::kInvalidArgument, "memoryMiB must be " + std::to_string(kMinMemoryMiB) + ".." +
                                            std::to_string(kMaxMemoryMiB));
  // Guest RAM is reserved lazily, so any size would map; but a guest that touches more than the
  // host has gets the host process (the user's app) killed by the OOM killer. Refused up front
  // (it once took 8.8 s of set-up to accept 1 TiB on a 24 GiB host).
  uint64_t host_mib = host_ram_mib();
  if (host_mib && cfg.memory_mib > host_mib)
    throw Error(code::kInvalidArgument, "memoryMiB " + std::to_string(cfg.memory_mib) + " is more than this host's " +
                                            std::to_string(host_mib) + " MiB of RAM");
  size_t devices = cfg.disks.size() + (cfg.vsock_cid ? 1 : 0) + (cfg.rng ? 1 : 0) + (cfg.net ? 1 : 0);
  if (devices > x86::kMaxVirtioDevices)
    throw Error(code::kInvalidArgument, "at most " + std::to_string(x86::kMaxVirtioDevices) + " virtio devices");
  // The vsock CID and the knock ports are lib's to check (lib/vm/machine.ts); the vsock device
  // asserts their ranges.
  precondition(cfg.vsock_knock_ports.empty() || cfg.vsock_cid.has_value(), "vsock knock ports only with a vsock device");
  if (cfg.console_ring_bytes == 0 || cfg.console_ring_bytes > (64u << 20))
    throw Error(code::kInvalidArgument, "consoleRingBytes must be 1..64 MiB");
}

// Runs one call on a thread of its own (inline when no thread can be
// started); wait() joins it and rethrows what it threw. Destroyed without
// wait() (an exception unwinding the caller), it joins and drops the outcome.
class ConcurrentCall {
 public:
  explicit ConcurrentCall(std::function<void()> fn) : fn_(std::move(fn)) {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error&) {
      run();
    }
  }
  ~ConcurrentCall() {
    if (thread_.joinable()) thread_.join();
  }
  ConcurrentCall(const ConcurrentCall&) = delete;
  ConcurrentCall& operator=(const ConcurrentCall&) = delete;
  void wait() {
    if (thread_.joinable()) thread_.join();
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void run() {
    try {
      fn_();
    } catch (...) {
      error_ = std::current_exception();
    }
  }
  std::function<void()> fn_;
  std::exception_ptr error_;
  std::thread thread_;
};

// KVM_GET_SUPPORTED_CPUID does not change while the process runs: ask once per device.
const std::vector<kvm_cpuid_entry2>& cached_supported_cpuid(const KvmSystem& sys, const std::string& device) {
  static std::mutex mu;
  static std::map<std::string, std::vector<kvm_cpuid_entry2>>* cache = new std::map<std::string, std::vector<kvm_cpuid_entry2>>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(device);
  if (it == cache->end()) it = cache->emplace(device, sys.supported_cpuid()).first;
  return it->second;
}

}  // namespace

const char* machine_state_name(MachineState s) {
  switch (s) {
    case MachineState::Created: return "created";
    case MachineState::Running: return "running";
    case MachineState::Pausing: return "pausing";
    case MachineState::Paused: return "paused";
    case MachineState::Stopped: return "stopped";
    case MachineState::Failed: return "failed";
  }
  return "failed";
}

Machine::Machine(const MachineConfig& cfg, Callbacks callbacks) : Machine(cfg, std::move(callbacks), nullptr) {}

Machine::Machine(const MachineConfig& cfg, Callbacks callbacks, RestorePlan* plan)
    : callbacks_(std::move(callbacks)), created_at_(std::chrono::steady_clock::now()) {
  config_ = cfg;
  PhaseClock own_clock;
  PhaseClock& clock = plan ? plan->clock : own_clock;
  host_kind_ = detect_host_kind();
  kvm_ = std::make_unique<KvmSystem>(cfg.kvm_device);
  for (auto [cap, name] : {std::pair{KVM_CAP_IRQCHIP, "irqchip"}, {KVM_CAP_PIT2, "pit2"},
                           {KVM_CAP_USER_MEMORY, "userMemory"}, {KVM_CAP_IMMEDIATE_EXIT, "immediateExit"}})
    if (kvm_->check_extension(cap) <= 0)
      throw Error(code::kKvmUnavailable, std::string("KVM at ") + cfg.kvm_device + " lacks " + name);
  validate(cfg, kvm_->check_extension(KVM_CAP_MAX_VCPUS));
  const bool have_irqfd = kvm_->check_extension(KVM_CAP_IRQFD) > 0;
  const bool have_ioeventfd = kvm_->check_extension(KVM_CAP_IOEVENTFD) > 0;

  clock.mark("kvm open + caps");
  // A restore takes a VM shell built ahead (VM, RAM slots, irqchip, PIT:
  // vmm/vm_pool.h), or builds one here when the pool has none.
  std::optional<ConcurrentCall> pit;
  if (plan) {
    auto shell = take_vm_shell(cfg.kvm_device, cfg.memory_mib * x86::kMiB);
    clock.mark(shell ? "VM shell from the pool" : "VM shell: none ready");
    if (!shell) shell = build_vm_shell(cfg.kvm_device, cfg.memory_mib * x86::kMiB, &clock);
    vm_ = std::move(shell->vm);
    ram_ = std::move(shell->ram);
    kvm_ = std::move(shell->kvm);  // the system fd the VM came from
    restore_ram(*ram_, *plan);
    clock.mark("ram: diffs read in");
  } else {
    vm_ = std::make_unique<KvmVm>(*kvm_);
    clock.mark("KVM_CREATE_VM");
    // The TSS and identity map matter only to VMX; elsewhere the calls are
    // accepted as no-ops or refused, and either is fine.
    if (kvm_->check_extension(KVM_CAP_SET_IDENTITY_MAP_ADDR) > 0) {
      try { vm_->set_identity_map_addr(x86::kIdentityMapAddr); } catch (const Error&) {}
    }
    try { vm_->set_tss_addr(x86::kTssAddr); } catch (const Error&) {}
    // Memory slots before the in-kernel irqchip: measured on PVM, registering a
    // slot once the irqchip exists costs ~7.5 ms (512 MiB, or 64 MiB), before
    // it ~0.8 ms.
    ram_ = std::make_unique<GuestRam>(*vm_, cfg.memory_mib * x86::kMiB);
    clock.mark("ram");
    vm_->create_irqchip();
    clock.mark("KVM_CREATE_IRQCHIP");
    // KVM_CREATE_PIT2 starts a kernel worker thread and waits for it to run:
    // 1-3 ms on this loaded PVM host (strace), most of a small machine's
    // create. Nothing needs the PIT before vCPUs or a restored state exist, so
    // it is created beside the devices and the kernel load (it needs the irqchip).
    pit.emplace([this] { vm_->create_pit2(); });
  }
  loop_ = std::make_unique<EventLoop>();
  seccomp_ = seccomp_wanted();
  if (seccomp_) watch_io_thread_violations();
  console_ = std::make_unique<Console>(cfg.console_ring_bytes, cfg.console_log, callbacks_.console_pending);

  serial_irq_ = std::make_unique<KvmIrqLine>(*vm_, x86::kSerialIrq, false);
  serial_ = std::make_unique<Serial8250>(*serial_irq_, [this](const uint8_t* p, size_t n) { console_->write(p, n); });
  if (!pio_bus_.insert(x86::kSerialPort, Serial8250::kRangeLen, serial_.get()))
    throw Error(code::kInternal, "serial port range refused");
  i8042_ = std::make_unique<I8042>([this] {
    std::lock_guard<std::mutex> lock(mu_);
    end_locked(false, "reset", "the guest reset the machine (i8042)");
  });
  if (!pio_bus_.insert(I8042::kBase, I8042::kRangeLen, i8042_.get())) throw Error(code::kInternal, "i8042 range refused");
  // Checked here, once: the port exists only for the test that asks for it.
  if (SeccompTestPort::wanted()) {
    seccomp_test_port_ = std::make_unique<SeccompTestPort>(*loop_);
    if (!pio_bus_.insert(SeccompTestPort::kPort, SeccompTestPort::kRangeLen, seccomp_test_port_.get()))
      throw Error(code::kInternal, "seccomp test port refused");
  }

  // virtio-mmio devices, in the platform order: disks, vsock, rng, net.
  auto next_irq = [&]() {
    uint32_t gsi = x86::kVirtioFirstGsi + static_cast<uint32_t>(virtio_.size());
    return std::make_unique<KvmIrqLine>(*vm_, gsi, have_irqfd);
  };
  for (const auto& disk : cfg.disks) {
    auto irq = next_irq();
    // A restored disk: base, the overlays earlier generations froze, a new top.
    auto dev = disk.frozen_overlays.empty()
                   ? make_virtio_blk(ram_->memory(), *irq, *loop_, disk)
                   : make_virtio_blk_on(ram_->memory(), *irq, *loop_,
                                        open_disk_chain(disk.base_path, disk.frozen_overlays, disk.overlay_path,
                                                        disk.size_bytes),
                                        disk);
    add_virtio(std::move(dev), std::move(irq));
  }
  if (cfg.vsock_cid) {
    auto irq = next_irq();
    VsockOptions opts;
    opts.guest_cid = *cfg.vsock_cid;
    auto dev = make_virtio_vsock(ram_->memory(), *irq, *loop_, opts, &vsock_host_);
    if (!cfg.vsock_knock_ports.empty()) vsock_host_->set_knock_ports(cfg.vsock_knock_ports, callbacks_.vsock_knocked);
    add_virtio(std::move(dev), std::move(irq));
  }
  if (cfg.rng) {
    auto irq = next_irq();
    auto dev = make_virtio_rng(ram_->memory(), *irq, *loop_);
    add_virtio(std::move(dev), std::move(irq));
  }
  if (cfg.net) {
    auto irq = next_irq();
    auto dev = make_virtio_net(ram_->memory(), *irq, *loop_, *cfg.net);
    net_dev_ = dev.get();
    add_virtio(std::move(dev), std::move(irq));
  }
  if (have_ioeventfd) {
    for (auto& slot : virtio_) {
      VirtioMmioDevice* dev = slot.dev.get();
      for (uint32_t q = 0; q < dev->num_queues(); q++) {
        Fd efd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        if (!efd.valid()) throw_sys_error(code::kInternal, "eventfd (ioeventfd)");
        try {
          vm_->ioeventfd(efd.get(), slot.base + kVirtioMmioQueueNotify, 4, q);
        } catch (const Error&) {
          break;  // the guest's write then exits to the vCPU thread: slower, same effect
        }
        int fd = efd.get();
        loop_->add(fd, EPOLLIN, [fd, dev, q](uint32_t) {
          uint64_t count;
          if (::read(fd, &count, sizeof(count)) == sizeof(count)) dev->notify(q);
        });
        slot.notify_fds.push_back(std::move(efd));
      }
    }
  }

  cmdline_ = cfg.cmdline;
  std::vector<uint32_t> gsis;
  for (size_t i = 0; i < virtio_.size(); i++) {
    char entry[64];
    std::snprintf(entry, sizeof(entry), " virtio_mmio.device=4K@0x%llx:%u",
                  static_cast<unsigned long long>(virtio_[i].base), virtio_[i].irq->gsi());
    cmdline_ += entry;
    gsis.push_back(virtio_[i].irq->gsi());
  }
  while (!cmdline_.empty() && cmdline_.front() == ' ') cmdline_.erase(cmdline_.begin());

  clock.mark("devices");
  if (plan) {
    load_state(*plan);
    clock.mark("load state (vCPUs, devices)");
    build_phases_ = clock.phases();
    return;
  }
  x86::BootConfig boot;
  boot.kernel_path = cfg.kernel;
  boot.initrd_path = cfg.initrd;
  boot.cmdline = cmdline_;
  boot.ram_bytes = ram_->size();
  boot.vcpus = cfg.vcpus;
  boot.device_gsis = gsis;
  boot.fresh_ram = true;  // anonymous RAM mapped above, untouched so far
  x86::BootEntry entry = x86::load_boot_image(ram_->memory(), boot);
  clock.mark("kernel load");
  pit->wait();
  clock.mark("KVM_CREATE_PIT2 wait");

  const auto& msrs = x86::msr_support(*kvm_);
  const auto& supported = cached_supported_cpuid(*kvm_, cfg.kvm_device);
  for (uint32_t i = 0; i < cfg.vcpus; i++) {
    auto kv = std::make_unique<KvmVcpu>(*kvm_, *vm_, i);
    auto cpuid = x86::build_cpuid(supported, i, cfg.vcpus, host_kind_, msrs);
    kv->set_cpuid(cpuid);
    x86::init_vcpu_common(*kv, msrs.index_list);
    x86::init_xcr0(*kv, x86::offered_xcr0(cpuid));
    if (i == 0) x86::init_boot_vcpu(*kv, entry);
    vcpus_.push_back(std::make_unique<Vcpu>(std::move(kv), static_cast<VcpuHost&>(*this)));
  }
  clock.mark("vCPUs");
  build_phases_ = clock.phases();
}

Machine::~Machine() {
  stop();
  drop_merge();
}

VirtioMmioDevice& Machine::net_device() {
  if (released()) throw Error(code::kInvalidState, "the machine was stopped and its network device released");
  if (!net_dev_) throw Error(code::kInvalidState, "this machine has no network device (set net)");
  return *net_dev_;
}

void Machine::net_attach(const std::string& socket_path) { virtio_net_connect_stream(net_device(), socket_path); }

int Machine::net_attach_pair() { return virtio_net_attach_pair(net_device()).release(); }

void Machine::net_set_egress_policy(EgressPolicy policy) {
  virtio_net_set_egress_policy(net_device(), std::move(policy));
}

void Machine::net_attach_fd(int fd) {
  Fd owned(fd);
  virtio_net_attach_stream(net_device(), std::move(owned));
}

std::string Machine::net_backend_error() {
  if (released() || !net_dev_) return "";
  return virtio_net_backend_error(*net_dev_);
}

void Machine::add_virtio(std::unique_ptr<VirtioMmioDevice> dev, std::unique_ptr<KvmIrqLine> irq) {
  if (!dev) throw Error(code::kInternal, "virtio device factory returned nothing");
  uint64_t base = x86::kVirtioMmioBase + virtio_.size() * kVirtioMmioWindow;
  if (!mmio_bus_.insert(base, kVirtioMmioWindow, dev.get())) throw Error(code::kInternal, "virtio-mmio range refused");
  VirtioSlot slot;
  slot.irq = std::move(irq);
  slot.dev = std::move(dev);
  slot.base = base;
  virtio_.push_back(std::move(slot));
}

void Machine::start(Done done, bool paused) {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ != MachineState::Created)
    throw Error(code::kInvalidState, std::string("start: machine is ") + machine_state_name(state_));
  state_ = paused ? MachineState::Pausing : MachineState::Running;
  threads_started_ = true;
  auto& waiters = paused ? pause_waiters_ : start_waiters_;
  waiters.push_back(std::move(done));
  if (paused) {
    parked_ = 0;
    pause_seq_++;
  }
  // Starting paused: the devices are quiesced before the I/O thread runs, so
  // what a restore queued (re-kicks of live queues, the vsock transport
  // reset) waits for resume() and the paused state is the captured one.
  if (paused) set_devices_quiesced(true);
  try {
    loop_->start([this] { io_thread_started(); });
    // A restored guest's vsock connections are gone (host sockets are not
    // saved): the transport-reset event tells its driver to drop them too.
    if (restored_ && vsock_host_) vsock_host_->transport_reset();
    for (auto& v : vcpus_) {
      v->start(paused ? Vcpu::Command::Pause : Vcpu::Command::Run, seccomp_);
      if (paused) v->send(Vcpu::Command::Pause);  // numbered like any pause: acknowledged once parked
    }
  } catch (const std::exception& e) {
    // std::thread throws when the process is out of threads. The caller gets
    // the error now (so its Done is taken back, not called); the threads
    // that did start are told to stop, and stop() finishes the machine.
    waiters.pop_back();
    std::string why = std::string("could not start the machine's threads: ") + e.what();
    end_locked(true, "internal-error", why);
    throw Error(code::kInternal, why, EAGAIN);
  }
}

void Machine::pause(Done done) {
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ == MachineState::Paused && pause_waiters_.empty()) {
    lock.unlock();
    done(nullptr, "");
    return;
  }
  if (state_ != MachineState::Running && state_ != MachineState::Pausing)
    throw Error(code::kInvalidState, std::string("pause: machine is ") + machine_state_name(state_));
  pause_waiters_.push_back(std::move(done));
  if (state_ == MachineState::Pausing) return;  // a pause is in flight: same completion
  state_ = MachineState::Pausing;
  parked_ = 0;
  pause_seq_++;
  for (auto& v : vcpus_) v->send(Vcpu::Command::Pause);
}

void Machine::resume() {
  std::vector<Done> abandoned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == MachineState::Running) return;
    if (state_ != MachineState::Paused && state_ != MachineState::Pausing)
      throw Error(code::kInvalidState, std::string("resume: machine is ") + machine_state_name(state_));
    state_ = MachineState::Running;
    abandoned.swap(pause_waiters_);
    // A machine paused for long may see a library take SIGSYS meanwhile.
    if (seccomp_) take_sigsys_handler();
    // Devices re-armed on the I/O thread, after any quiesce posted before
    // (the loop runs posted closures in order). A vCPU kick that arrives
    // before that is held by its transport and served by unquiesce.
    loop_->post([this] { set_devices_quiesced(false); });
    for (auto& v : vcpus_) v->send(Vcpu::Command::Run);
  }
  for (auto& d : abandoned) d(code::kInvalidState, "resumed before the pause completed");
}

ExitReason Machine::stop() {
  std::lock_guard<std::mutex> serial(stop_mu_);
  return stop_locked();
}

ExitReason Machine::stop_locked() {
  if (released_.load()) {
    std::lock_guard<std::mutex> lock(mu_);
    return reason_;
  }
  bool started;
  {
    std::lock_guard<std::mutex> lock(mu_);
    end_locked(false, "stop", "stopped by the host");
    started = threads_started_;
  }
  for (auto& v : vcpus_) v->join();
  if (!started || vcpus_.empty()) finish();
  // With threads, the last vCPU thread ran finish(); call_once makes this
  // wait for it if it is still running.
  finish();
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

ExitReason Machine::release(bool defer_kvm) {
  std::lock_guard<std::mutex> serial(stop_mu_);
  ExitReason reason = stop_locked();
  if (released_.load()) return reason;
  // A layer merge reads only layer files: it gives up, and what it wrote goes.
  drop_merge();
  // Every vCPU thread is joined and the I/O thread stopped: nothing else
  // touches the devices, the buses or guest memory any more.
  final_stats_ = collect_stats();
  released_.store(true);
  vsock_host_ = nullptr;
  net_dev_ = nullptr;
  for (auto& v : virtio_) mmio_bus_.remove(v.base);
  pio_bus_.remove(x86::kSerialPort);
  pio_bus_.remove(I8042::kBase);
  if (seccomp_test_port_) pio_bus_.remove(SeccompTestPort::kPort);
  // Devices first and here: a disk's overlay is closed (and flushed) before
  // stop() resolves, so the caller may reuse or delete it at once.
  virtio_.clear();  // devices (disk files, vsock sockets, timerfd), ioeventfds, irqfds
  i8042_.reset();
  seccomp_test_port_.reset();
  serial_.reset();
  serial_irq_.reset();
  loop_.reset();  // epoll and wake fds
  seccomp_notify_.reset();
  console_->close_log();
  // Capture scratch (up to a whole diff of RAM) goes now, not when JS collects the wrapper.
  std::vector<uint8_t>().swap(capture_buf_);
  std::vector<uint64_t>().swap(dirty_);
  // The kernel destroys the VM when its last fd closes, which takes a while:
  // done on the reaper thread (vmm/reaper.h). vCPUs before RAM before the VM.
  auto vcpus = std::make_shared<std::vector<std::unique_ptr<Vcpu>>>();
  {
    std::lock_guard<std::mutex> lock(vcpus_mu_);
    *vcpus = std::move(vcpus_);
    vcpus_.clear();
  }
  std::shared_ptr<GuestRam> ram(std::move(ram_));
  std::shared_ptr<KvmVm> vm(std::move(vm_));
  std::shared_ptr<KvmSystem> kvm(std::move(kvm_));
  auto teardown = [vcpus, ram, vm, kvm]() mutable {
    vcpus->clear();
    ram.reset();
    vm.reset();
    kvm.reset();
  };
  if (defer_kvm)
    reap_later(std::move(teardown));
  else
    teardown();
  return reason;
}

void Machine::end_locked(bool failed, const std::string& kind, const std::string& message) {
  if (ending_) return;
  ending_ = true;
  failed_ = failed;
  reason_.kind = kind;
  reason_.message = message;
  auto tail = console_ ? console_->tail(kExitTailBytes) : std::vector<uint8_t>{};
  reason_.console_tail.assign(tail.begin(), tail.end());
  for (auto& v : vcpus_) v->send(Vcpu::Command::Stop);
}

void Machine::finish() {
  std::call_once(finish_once_, [this] {
    if (loop_) loop_->stop();
    std::vector<Done> waiters;
    MachineState final_state;
    ExitReason reason;
    {
      std::lock_guard<std::mutex> lock(mu_);
      state_ = failed_ ? MachineState::Failed : MachineState::Stopped;
      finished_ = true;
      for (auto& d : start_waiters_) waiters.push_back(std::move(d));
      for (auto& d : pause_waiters_) waiters.push_back(std::move(d));
      start_waiters_.clear();
      pause_waiters_.clear();
      final_state = state_;
      reason = reason_;
    }
    for (auto& d : waiters)
      d(final_state == MachineState::Failed ? code::kMachineFailed : code::kInvalidState,
        "the machine ended (" + reason.kind + "): " + reason.message);
    if (callbacks_.exited) callbacks_.exited(final_state, reason);
  });
}

void Machine::prepare_restores(size_t count) {
  vm_pool_reserve(config_.kvm_device, config_.memory_mib * x86::kMiB, count);
}

MachineState Machine::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

std::optional<ExitReason> Machine::exit_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!finished_) return std::nullopt;
  return reason_;
}

MachineStats Machine::stats() const {
  if (released_.load()) return final_stats_;
  return collect_stats();
}

MachineStats Machine::collect_stats() const {
  std::lock_guard<std::mutex> lock(vcpus_mu_);
  MachineStats s;
  for (const auto& v : vcpus_) {
    const auto& c = v->counters();
    s.exits += c.exits.load(std::memory_order_relaxed);
    s.pio_exits += c.pio.load(std::memory_order_relaxed);
    s.mmio_exits += c.mmio.load(std::memory_order_relaxed);
    s.halt_exits += c.hlt.load(std::memory_order_relaxed);
  }
  s.create_to_first_run_ns = first_run_ns_.load(std::memory_order_relaxed);
  s.create_to_first_exit_ns = first_exit_ns_.load(std::memory_order_relaxed);
  if (s.create_to_first_exit_ns)
    s.first_exit_at_ns = static_cast<uint64_t>(
                             std::chrono::duration_cast<std::chrono::nanoseconds>(created_at_.time_since_epoch()).count()) +
                         s.create_to_first_exit_ns;
  s.build_phases = build_phases_;
  return s;
}

std::vector<std::pair<uint64_t, BusDevice*>> Machine::devices() {
  std::vector<std::pair<uint64_t, BusDevice*>> out;
  if (released_.load()) return out;
  out.emplace_back(x86::kSerialPort, serial_.get());
  out.emplace_back(I8042::kBase, i8042_.get());
  for (auto& v : virtio_) out.emplace_back(v.base, v.dev.get());
  return out;
}

size_t Machine::console_input(const uint8_t* data, size_t len) {
  return require(serial_, "serial port")->enqueue_input(data, len);
}

void Machine::note_first_exit() {
  uint64_t zero = 0;
  first_exit_ns_.compare_exchange_strong(zero, now_ns(created_at_), std::memory_order_relaxed);
}

void Machine::vcpu_pio(uint16_t port, uint8_t* data, size_t len, bool is_write) {
  if (first_exit_ns_.load(std::memory_order_relaxed) == 0) note_first_exit();
  if (is_write) {
    pio_bus_.write(port, data, len);
  } else if (!pio_bus_.read(port, data, len)) {
    std::memset(data, 0xff, len);  // nothing there: the bus floats high
  }
}

void Machine::watch_io_thread_violations() {
  seccomp_notify_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!seccomp_notify_.valid()) throw_sys_error(code::kInternal, "eventfd (seccomp notification)");
  int fd = seccomp_notify_.get();
  // Runs on the I/O thread, the one whose handler wrote the fd: its own
  // record of the refused call is the one read here.
  loop_->add(fd, EPOLLIN, [this, fd](uint32_t) {
    uint64_t count;
    if (::read(fd, &count, sizeof(count)) != sizeof(count)) return;
    int nr = seccomp_violation();
    std::lock_guard<std::mutex> lock(mu_);
    end_locked(true, "seccomp-violation",
               "the I/O thread made " + seccomp_describe(nr) + ", outside its seccomp allow-list (docs/seccomp.md)");
  });
}

void Machine::io_thread_started() {
  pthread_setname_np(pthread_self(), "torpor-io");
  if (!seccomp_) return;
  try {
    seccomp_enter(ThreadRole::Io, seccomp_notify_.get());
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    end_locked(true, "internal-error",
               std::string("the I/O thread could not install its seccomp filter: ") + e.what() +
                   " (TORPOR_SECCOMP=off runs without)");
  }
}

void Machine::vcpu_mmio(uint64_t addr, uint8_t* data, size_t len, bool is_write) {
  if (first_exit_ns_.load(std::memory_order_relaxed) == 0) note_first_exit();
  if (is_write) {
    mmio_bus_.write(addr, data, len);
  } else if (!mmio_bus_.read(addr, data, len)) {
    std::memset(data, 0xff, len);
  }
}

void Machine::vcpu_entered(uint32_t index) {
  if (index == 0) first_run_ns_.store(now_ns(created_at_), std::memory_order_relaxed);
  std::vector<Done> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (++entered_ == vcpus_.size()) ready.swap(start_waiters_);
  }
  for (auto& d : ready) d(nullptr, "");
}

void Machine::vcpu_parked(uint32_t, uint64_t pause_seq) {
  std::vector<Done> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A vCPU that parked for a pause the host already resumed from must not
    // count towards the next one: that vCPU would be counted twice and the
    // pause would complete with another vCPU still inside KVM_RUN.
    if (state_ != MachineState::Pausing || pause_seq != pause_seq_) return;
    if (++parked_ != vcpus_.size()) return;
  }
  // Every vCPU is out of KVM_RUN: quiesce the devices on the I/O thread,
  // where no device callback can be running at the same time (a block
  // request in flight completes first: requests are served synchronously).
  if (!loop_->post([this, pause_seq] { quiesce_devices(pause_seq); })) quiesce_devices(pause_seq);
}

void Machine::quiesce_devices(uint64_t seq) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != MachineState::Pausing || seq != pause_seq_) return;  // resumed or ended meanwhile
  }
  set_devices_quiesced(true);
  std::vector<Done> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != MachineState::Pausing || seq != pause_seq_) return;  // resume's unquiesce is queued behind us
    state_ = MachineState::Paused;
    ready.swap(pause_waiters_);
  }
  for (auto& d : ready) d(nullptr, "");
}

void Machine::set_devices_quiesced(bool quiesced) {
  for (auto& slot : virtio_) {
    if (quiesced)
      slot.dev->quiesce();
    else
      slot.dev->unquiesce();
  }
}

void Machine::vcpu_guest_ended(uint32_t, bool failed, const std::string& kind, const std::string& message) {
  std::lock_guard<std::mutex> lock(mu_);
  end_locked(failed, kind, message);
}

void Machine::vcpu_exited(uint32_t) {
  bool last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = ++exited_ == vcpus_.size();
  }
  if (last) finish();
}

}  // namespace torpor
