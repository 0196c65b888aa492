// The compatibility fingerprint of this host (snapshot/fingerprint.h):
// host kind, CPU identity and the CPUID feature words that matter, TSC
// frequency, KVM API version and, on PVM, the module build. Probed once per
// process and device.
#pragma once

#include <string>

#include "snapshot/fingerprint.h"
#include "vmm/host_probe.h"
#include "vmm/kvm.h"

namespace torpor {

HostFingerprint probe_fingerprint(const KvmSystem& sys, HostKind kind);

}  // namespace torpor
