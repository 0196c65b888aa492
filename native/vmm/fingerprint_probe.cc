#include "vmm/fingerprint_probe.h"

#include <cpuid.h>
#include <sys/ioctl.h>

#include <cstring>
#include <fstream>
#include <mutex>

namespace torpor {

namespace {

void cpuid(uint32_t leaf, uint32_t sub, uint32_t r[4]) { __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]); }

std::string read_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  if (f) std::getline(f, s);
  return s;
}

HostFingerprint probe(const KvmSystem& sys, HostKind kind) {
  HostFingerprint fp;
  fp.host_kind = kind == HostKind::Pvm ? "pvm" : "hardware";
  uint32_t r[4];
  cpuid(0, 0, r);
  uint32_t max_leaf = r[0];
  char vendor[13] = {};
  std::memcpy(vendor, &r[1], 4);
  std::memcpy(vendor + 4, &r[3], 4);
  std::memcpy(vendor + 8, &r[2], 4);
  fp.cpu_vendor = vendor;
  cpuid(1, 0, r);
  uint32_t eax = r[0];
  uint32_t base_family = (eax >> 8) & 0xf, base_model = (eax >> 4) & 0xf;
  fp.family = base_family == 0xf ? base_family + ((eax >> 20) & 0xff) : base_family;
  fp.model = (base_family == 0x6 || base_family == 0xf) ? (((eax >> 16) & 0xf) << 4) | base_model : base_model;
  fp.stepping = eax & 0xf;
  fp.features.push_back(r[2]);  // 1.ecx
  fp.features.push_back(r[3]);  // 1.edx
  uint32_t z[4] = {};
  if (max_leaf >= 7) cpuid(7, 0, r); else std::memcpy(r, z, sizeof z);
  fp.features.push_back(r[1]);
  fp.features.push_back(r[2]);
  fp.features.push_back(r[3]);
  if (max_leaf >= 0xd) cpuid(0xd, 1, r); else std::memcpy(r, z, sizeof z);
  fp.features.push_back(r[0]);
  cpuid(0x80000000, 0, r);
  if (r[0] >= 0x80000001) cpuid(0x80000001, 0, r); else std::memcpy(r, z, sizeof z);
  fp.features.push_back(r[2]);
  fp.features.push_back(r[3]);
  // The TSC frequency KVM gives a vCPU by default (the guest calibrated to it).
  if (sys.check_extension(KVM_CAP_GET_TSC_KHZ) > 0) {
    KvmVm vm(sys);
    KvmVcpu vcpu(sys, vm, 0);
    int khz = kvm_ioctl(vcpu.fd(), KVM_GET_TSC_KHZ, 0);
    if (khz > 0) fp.tsc_khz = static_cast<uint32_t>(khz);
  }
  fp.kvm_api = static_cast<uint32_t>(sys.api_version());
  // A PVM module built into the host kernel has no srcversion: the kernel build identifies it then.
  if (kind == HostKind::Pvm) {
    fp.kvm_module_id = read_line("/sys/module/kvm_pvm/srcversion");
    if (fp.kvm_module_id.empty()) fp.kvm_module_id = read_line("/proc/version");
  }
  return fp;
}

}  // namespace

HostFingerprint probe_fingerprint(const KvmSystem& sys, HostKind kind) {
  static std::mutex mu;
  static HostFingerprint* cached = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  if (!cached) cached = new HostFingerprint(probe(sys, kind));
  return *cached;
}

}  // namespace torpor
