// What this host's KVM can do, and which kind of KVM host it is.
//
// Two kinds exist (docs/platform.md, docs/architecture.md#hosts): hardware virtualization
// (vmx/svm with kvm_intel/kvm_amd loaded) and PVM (the kvm_pvm module: KVM
// without hardware virtualization). The kind decides which guest kernels run
// and how the CPUID hypervisor leaves are set up.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace torpor {

enum class HostKind { Hardware, Pvm };
const char* host_kind_name(HostKind kind);

// Reads /sys/module and /proc/cpuinfo. PVM wins when kvm_pvm is loaded: a
// cloud VM may advertise vmx to its own kernel without being able to use it.
HostKind detect_host_kind();

struct HostProbeResult {
  std::string device;
  int api_version = 0;
  HostKind host_kind = HostKind::Hardware;
  std::string cpu_vendor;
  std::vector<std::pair<std::string, bool>> capabilities;
  std::vector<std::pair<std::string, int>> capability_values;
  std::vector<std::string> missing;  // required capabilities this host lacks
};

// Opens the device and reports; throws Error(KVM_UNAVAILABLE) when the device
// is missing or not accessible. Missing required capabilities are listed in
// `missing` (a machine refuses to start then, with the same list).
HostProbeResult probe_host(const std::string& device = "/dev/kvm");

// Throws KVM_UNAVAILABLE naming the missing capabilities, if any.
void require_capabilities(const HostProbeResult& probe);

}  // namespace torpor
