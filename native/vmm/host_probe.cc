#include "vmm/host_probe.h"

#include <cpuid.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "vmm/kvm.h"

namespace torpor {

namespace {

bool path_exists(const char* p) {
  struct stat st;
  return ::stat(p, &st) == 0;
}

bool cpuinfo_has_flag(const char* flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') == std::string::npos ? 0 : line.find(':') + 1));
    std::string w;
    while (words >> w)
      if (w == flag) return true;
    return false;  // the first CPU's flags are enough
  }
  return false;
}

std::string host_cpu_vendor() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  __cpuid(0, a, b, c, d);
  char v[13];
  std::memcpy(v, &b, 4);
  std::memcpy(v + 4, &d, 4);
  std::memcpy(v + 8, &c, 4);
  v[12] = 0;
  return v;
}

struct CapSpec {
  const char* name;
  long cap;
  bool required;
};

// The capabilities torpor relies on (required) or uses when present.
constexpr CapSpec kCaps[] = {
    {"irqchip", KVM_CAP_IRQCHIP, true},
    {"pit2", KVM_CAP_PIT2, true},
    {"userMemory", KVM_CAP_USER_MEMORY, true},
    {"immediateExit", KVM_CAP_IMMEDIATE_EXIT, true},
    {"ioeventfd", KVM_CAP_IOEVENTFD, true},
    {"dirtyLog", KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2, false},
    {"manualDirtyLogProtect", KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2, false},
    {"xsave", KVM_CAP_XSAVE, false},
    {"xcrs", KVM_CAP_XCRS, false},
    {"xsave2", KVM_CAP_XSAVE2, false},
    {"kvmclockCtrl", KVM_CAP_KVMCLOCK_CTRL, false},
    {"preFaultMemory", KVM_CAP_PRE_FAULT_MEMORY, false},
    {"irqfd", KVM_CAP_IRQFD, false},
    {"tscControl", KVM_CAP_TSC_CONTROL, false},
    {"setIdentityMapAddr", KVM_CAP_SET_IDENTITY_MAP_ADDR, false},
    {"msrFeatures", KVM_CAP_GET_MSR_FEATURES, false},
};

}  // namespace

const char* host_kind_name(HostKind kind) { return kind == HostKind::Pvm ? "pvm" : "hardware"; }

HostKind detect_host_kind() {
  if (path_exists("/sys/module/kvm_pvm")) return HostKind::Pvm;
  bool hw_module = path_exists("/sys/module/kvm_intel") || path_exists("/sys/module/kvm_amd");
  if (hw_module && (cpuinfo_has_flag("vmx") || cpuinfo_has_flag("svm"))) return HostKind::Hardware;
  // Neither signal is conclusive; an unknown KVM provider behaves like
  // hardware KVM as far as the VMM is concerned.
  return HostKind::Hardware;
}

HostProbeResult probe_host(const std::string& device) {
  KvmSystem sys(device);
  HostProbeResult r;
  r.device = device;
  r.api_version = sys.api_version();
  r.host_kind = detect_host_kind();
  r.cpu_vendor = host_cpu_vendor();
  for (const auto& c : kCaps) {
    int v = sys.check_extension(c.cap);
    // Dirty logging itself is part of the base API (KVM_GET_DIRTY_LOG);
    // the capability reported as dirtyLog is always there with user memory.
    if (std::strcmp(c.name, "dirtyLog") == 0) v = sys.check_extension(KVM_CAP_USER_MEMORY);
    r.capabilities.emplace_back(c.name, v > 0);
    if (c.required && v <= 0) r.missing.emplace_back(c.name);
  }
  r.capability_values.emplace_back("maxVcpus", sys.check_extension(KVM_CAP_MAX_VCPUS));
  r.capability_values.emplace_back("nrVcpus", sys.check_extension(KVM_CAP_NR_VCPUS));
  r.capability_values.emplace_back("nrMemslots", sys.check_extension(KVM_CAP_NR_MEMSLOTS));
  r.capability_values.emplace_back("xsave2Size", sys.check_extension(KVM_CAP_XSAVE2));
  r.capability_values.emplace_back("manualDirtyLogProtect", sys.check_extension(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2));
  r.capability_values.emplace_back("vcpuMmapSize", static_cast<int>(sys.vcpu_mmap_size()));
  return r;
}

void require_capabilities(const HostProbeResult& probe) {
  if (probe.missing.empty()) return;
  std::string list;
  for (const auto& m : probe.missing) list += (list.empty() ? "" : ", ") + m;
  throw Error(code::kKvmUnavailable, "KVM at " + probe.device + " lacks capabilities torpor needs: " + list);
}

}  // namespace torpor
