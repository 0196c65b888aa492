// What a snapshot must match on the host that restores it.
//
// The fingerprint is written into every state file (envelope.h) and checked
// before KVM is touched: a snapshot taken on a PVM host never restores on a
// hardware-virtualization host and vice versa, and a CPU lacking a feature
// the guest may have used is refused up front (the guest would fault on the
// first such instruction, long after the restore "succeeded").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "snapshot/state_io.h"

namespace torpor {

struct HostFingerprint {
  std::string host_kind;           // "hardware" | "pvm"
  std::string cpu_vendor;          // CPUID 0 vendor string, e.g. "GenuineIntel"
  uint32_t family = 0, model = 0, stepping = 0;
  // CPUID words that matter, in a fixed order (the prober's): 1.ecx, 1.edx,
  // 7.0.ebx, 7.0.ecx, 7.0.edx, 0xd.1.eax, 0x80000001.ecx, 0x80000001.edx.
  // Compared bit by bit: every bit set when saved must be set here.
  std::vector<uint32_t> features;
  uint32_t tsc_khz = 0;
  uint32_t kvm_api = 0;
  std::string kvm_module_id;       // on PVM: /sys/module/kvm_pvm srcversion (or similar); "" elsewhere

  bool operator==(const HostFingerprint&) const = default;
};

// Bounds on what read_fingerprint accepts (the input is untrusted).
inline constexpr size_t kMaxFingerprintString = 256;
inline constexpr size_t kMaxFingerprintFeatures = 64;

void write_fingerprint(StateWriter& w, const HostFingerprint& fp);
// Throws Error(SNAPSHOT_INVALID) on a malformed fingerprint.
HostFingerprint read_fingerprint(StateReader& r);

// Throws Error(SNAPSHOT_INCOMPATIBLE) naming the first difference: another
// host kind, CPU vendor, a feature bit missing here, another TSC frequency
// (a guest's clocksource is calibrated to it), another KVM API version or,
// on PVM, another module build.
void check_compatible(const HostFingerprint& saved, const HostFingerprint& here);

}  // namespace torpor
