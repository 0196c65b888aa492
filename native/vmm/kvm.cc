#include "vmm/kvm.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

#include "common/error.h"
#include "vmm/kvm_abi.h"

namespace torpor {

namespace {
std::atomic<uint64_t> g_kvm_calls{0};
}  // namespace

int kvm_ioctl(int fd, unsigned long req, unsigned long arg) {
  g_kvm_calls.fetch_add(1, std::memory_order_relaxed);
  int r;
  do {
    r = ::ioctl(fd, req, arg);
  } while (r < 0 && errno == EINTR);
  return r;
}

uint64_t kvm_call_count() { return g_kvm_calls.load(std::memory_order_relaxed); }

namespace {

// The entries of one of KVM's count-prefixed lists (a u32 count at the start of a
// `header`-byte header, then the entries), never more than the buffer held.
template <typename T>
std::vector<T> counted_entries(const std::vector<uint8_t>& buf, size_t header, uint32_t capacity) {
  uint32_t got;
  std::memcpy(&got, buf.data(), 4);
  if (got > capacity) got = capacity;
  std::vector<T> out(got);
  std::memcpy(out.data(), buf.data() + header, got * sizeof(T));
  return out;
}

}  // namespace

KvmSystem::KvmSystem(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    std::string why;
    if (e == ENOENT)
      why = path + " does not exist: this kernel has no KVM (load kvm_intel/kvm_amd or kvm_pvm, or enable nested virtualization)";
    else if (e == EACCES || e == EPERM)
      why = "no permission to open " + path + " read/write: add your user to the 'kvm' group (or run as root)";
    else
      why = "cannot open " + path + ": " + std::strerror(e);
    throw Error(code::kKvmUnavailable, why, e);
  }
  fd_.reset(fd);
  api_version_ = kvm_ioctl(fd, KVM_GET_API_VERSION, 0);
  if (api_version_ < 0) throw_sys_error(code::kKvmUnavailable, path + " is not a KVM device (KVM_GET_API_VERSION)");
  if (api_version_ != KVM_API_VERSION)
    throw Error(code::kKvmUnavailable, "KVM API version " + std::to_string(api_version_) + " (expected " +
                                           std::to_string(KVM_API_VERSION) + ")");
}

int KvmSystem::check_extension(long cap) const {
  int r = kvm_ioctl(fd_.get(), KVM_CHECK_EXTENSION, static_cast<unsigned long>(cap));
  return r < 0 ? 0 : r;
}

size_t KvmSystem::vcpu_mmap_size() const {
  int r = kvm_ioctl(fd_.get(), KVM_GET_VCPU_MMAP_SIZE, 0);
  if (r <= 0) throw_sys_error(code::kKvmUnavailable, "KVM_GET_VCPU_MMAP_SIZE");
  return static_cast<size_t>(r);
}

std::vector<kvm_cpuid_entry2> KvmSystem::supported_cpuid() const {
  for (uint32_t n = 128; n <= 4096; n *= 2) {
    size_t bytes = kvm_abi::kCpuid2Header + n * sizeof(kvm_cpuid_entry2);
    std::vector<uint8_t> buf(bytes, 0);
    std::memcpy(buf.data(), &n, 4);
    if (kvm_ioctl(fd_.get(), kvm_abi::kGetSupportedCpuid, reinterpret_cast<unsigned long>(buf.data())) == 0) {
      return counted_entries<kvm_cpuid_entry2>(buf, kvm_abi::kCpuid2Header, n);
    }
    if (errno != E2BIG) throw_sys_error(code::kKvmUnavailable, "KVM_GET_SUPPORTED_CPUID");
  }
  throw Error(code::kKvmUnavailable, "KVM_GET_SUPPORTED_CPUID: too many entries");
}

std::vector<uint32_t> KvmSystem::msr_index_list() const {
  uint32_t n = 0;
  // The first call fails with E2BIG and reports the count.
  kvm_ioctl(fd_.get(), kvm_abi::kGetMsrIndexList, reinterpret_cast<unsigned long>(&n));
  if (n == 0 || n > 65536) return {};
  std::vector<uint8_t> buf(kvm_abi::kMsrListHeader + n * sizeof(uint32_t), 0);
  std::memcpy(buf.data(), &n, 4);
  if (kvm_ioctl(fd_.get(), kvm_abi::kGetMsrIndexList, reinterpret_cast<unsigned long>(buf.data())) < 0) return {};
  return counted_entries<uint32_t>(buf, kvm_abi::kMsrListHeader, n);
}

KvmVm::KvmVm(const KvmSystem& sys) {
  int fd = kvm_ioctl(sys.fd(), KVM_CREATE_VM, 0);  // type 0: default x86 VM
  if (fd < 0) throw_sys_error(code::kKvmUnavailable, "KVM_CREATE_VM");
  fd_.reset(fd);
}

int KvmVm::check_extension(long cap) const {
  int r = kvm_ioctl(fd_.get(), KVM_CHECK_EXTENSION, static_cast<unsigned long>(cap));
  return r < 0 ? 0 : r;
}

void KvmVm::set_tss_addr(uint64_t addr) {
  if (kvm_ioctl(fd_.get(), KVM_SET_TSS_ADDR, addr) < 0) throw_sys_error(code::kInternal, "KVM_SET_TSS_ADDR");
}

void KvmVm::set_identity_map_addr(uint64_t addr) {
  if (kvm_ioctl(fd_.get(), KVM_SET_IDENTITY_MAP_ADDR, reinterpret_cast<unsigned long>(&addr)) < 0)
    throw_sys_error(code::kInternal, "KVM_SET_IDENTITY_MAP_ADDR");
}

void KvmVm::create_irqchip() {
  if (kvm_ioctl(fd_.get(), KVM_CREATE_IRQCHIP, 0) < 0) throw_sys_error(code::kKvmUnavailable, "KVM_CREATE_IRQCHIP");
}

void KvmVm::create_pit2() {
  kvm_pit_config cfg{};
  cfg.flags = KVM_PIT_SPEAKER_DUMMY;
  if (kvm_ioctl(fd_.get(), KVM_CREATE_PIT2, reinterpret_cast<unsigned long>(&cfg)) < 0)
    throw_sys_error(code::kKvmUnavailable, "KVM_CREATE_PIT2");
}

void KvmVm::set_user_memory_region(uint32_t slot, uint64_t gpa, uint64_t size, void* host, uint32_t flags) {
  kvm_userspace_memory_region r{};
  r.slot = slot;
  r.flags = flags;
  r.guest_phys_addr = gpa;
  r.memory_size = size;
  r.userspace_addr = reinterpret_cast<uint64_t>(host);
  if (kvm_ioctl(fd_.get(), KVM_SET_USER_MEMORY_REGION, reinterpret_cast<unsigned long>(&r)) < 0)
    throw_sys_error(code::kInternal, "KVM_SET_USER_MEMORY_REGION slot " + std::to_string(slot));
}

void KvmVm::get_dirty_log(uint32_t slot, std::vector<uint64_t>& bitmap) {
  std::vector<uint64_t> log(bitmap.size(), 0);
  kvm_dirty_log d{};
  d.slot = slot;
  d.dirty_bitmap = log.data();
  if (kvm_ioctl(fd_.get(), KVM_GET_DIRTY_LOG, reinterpret_cast<unsigned long>(&d)) < 0)
    throw_sys_error(code::kInternal, "KVM_GET_DIRTY_LOG slot " + std::to_string(slot));
  for (size_t i = 0; i < log.size(); i++) bitmap[i] |= log[i];
}

void KvmVm::irq_line(uint32_t gsi, bool level) {
  kvm_irq_level l{};
  l.irq = gsi;
  l.level = level ? 1 : 0;
  // A failure here means the VM is being torn down; an interrupt is lost, nothing else.
  kvm_ioctl(fd_.get(), KVM_IRQ_LINE, reinterpret_cast<unsigned long>(&l));
}

void KvmVm::irqfd(int event_fd, uint32_t gsi) {
  kvm_irqfd f{};
  f.fd = static_cast<uint32_t>(event_fd);
  f.gsi = gsi;
  if (kvm_ioctl(fd_.get(), KVM_IRQFD, reinterpret_cast<unsigned long>(&f)) < 0)
    throw_sys_error(code::kInternal, "KVM_IRQFD gsi " + std::to_string(gsi));
}

void KvmVm::irqfd_remove(int event_fd, uint32_t gsi) {
  kvm_irqfd f{};
  f.fd = static_cast<uint32_t>(event_fd);
  f.gsi = gsi;
  f.flags = KVM_IRQFD_FLAG_DEASSIGN;
  kvm_ioctl(fd_.get(), KVM_IRQFD, reinterpret_cast<unsigned long>(&f));
}

void KvmVm::ioeventfd(int event_fd, uint64_t addr, uint32_t len, uint64_t datamatch) {
  kvm_ioeventfd e{};
  e.datamatch = datamatch;
  e.addr = addr;
  e.len = len;
  e.fd = event_fd;
  e.flags = KVM_IOEVENTFD_FLAG_DATAMATCH;
  if (kvm_ioctl(fd_.get(), KVM_IOEVENTFD, reinterpret_cast<unsigned long>(&e)) < 0)
    throw_sys_error(code::kInternal, "KVM_IOEVENTFD");
}

void KvmVm::ioeventfd_remove(int event_fd, uint64_t addr, uint32_t len, uint64_t datamatch) {
  kvm_ioeventfd e{};
  e.datamatch = datamatch;
  e.addr = addr;
  e.len = len;
  e.fd = event_fd;
  e.flags = KVM_IOEVENTFD_FLAG_DATAMATCH | KVM_IOEVENTFD_FLAG_DEASSIGN;
  kvm_ioctl(fd_.get(), KVM_IOEVENTFD, reinterpret_cast<unsigned long>(&e));
}

KvmVcpu::KvmVcpu(const KvmSystem& sys, const KvmVm& vm, uint32_t index) : index_(index) {
  int fd = kvm_ioctl(vm.fd(), KVM_CREATE_VCPU, index);
  if (fd < 0) throw_sys_error(code::kInternal, "KVM_CREATE_VCPU " + std::to_string(index));
  fd_.reset(fd);
  run_size_ = sys.vcpu_mmap_size();
  void* p = ::mmap(nullptr, run_size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw_sys_error(code::kInternal, "mmap kvm_run");
  run_ = static_cast<kvm_run*>(p);
}

KvmVcpu::~KvmVcpu() {
  if (run_) ::munmap(run_, run_size_);
}

void KvmVcpu::ioctl_or_throw(unsigned long request, void* arg, const char* what) const {
  if (kvm_ioctl(fd_.get(), request, reinterpret_cast<unsigned long>(arg)) < 0)
    throw_sys_error(code::kInternal, std::string(what) + " (vCPU " + std::to_string(index_) + ")");
}

void KvmVcpu::set_cpuid(const std::vector<kvm_cpuid_entry2>& entries) {
  std::vector<uint8_t> buf(kvm_abi::kCpuid2Header + entries.size() * sizeof(kvm_cpuid_entry2), 0);
  uint32_t n = static_cast<uint32_t>(entries.size());
  std::memcpy(buf.data(), &n, 4);
  std::memcpy(buf.data() + kvm_abi::kCpuid2Header, entries.data(), entries.size() * sizeof(kvm_cpuid_entry2));
  ioctl_or_throw(kvm_abi::kSetCpuid2, buf.data(), "KVM_SET_CPUID2");
}

size_t KvmVcpu::set_msrs(const std::vector<std::pair<uint32_t, uint64_t>>& msrs) {
  std::vector<uint8_t> buf(kvm_abi::kMsrsHeader + msrs.size() * sizeof(kvm_msr_entry), 0);
  uint32_t n = static_cast<uint32_t>(msrs.size());
  std::memcpy(buf.data(), &n, 4);
  for (size_t i = 0; i < msrs.size(); i++) {
    kvm_msr_entry e{};
    e.index = msrs[i].first;
    e.data = msrs[i].second;
    std::memcpy(buf.data() + kvm_abi::kMsrsHeader + i * sizeof(e), &e, sizeof(e));
  }
  int r = kvm_ioctl(fd_.get(), kvm_abi::kSetMsrs, reinterpret_cast<unsigned long>(buf.data()));
  return r < 0 ? 0 : static_cast<size_t>(r);
}

bool KvmVcpu::get_msr(uint32_t index, uint64_t* value) {
  alignas(8) uint8_t buf[kvm_abi::kMsrsHeader + sizeof(kvm_msr_entry)] = {};
  uint32_t n = 1;
  std::memcpy(buf, &n, 4);
  kvm_msr_entry e{};
  e.index = index;
  std::memcpy(buf + kvm_abi::kMsrsHeader, &e, sizeof(e));
  int r = kvm_ioctl(fd_.get(), kvm_abi::kGetMsrs, reinterpret_cast<unsigned long>(buf));
  if (r != 1) return false;
  std::memcpy(&e, buf + kvm_abi::kMsrsHeader, sizeof(e));
  *value = e.data;
  return true;
}

}  // namespace torpor
