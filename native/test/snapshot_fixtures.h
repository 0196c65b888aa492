// Inputs shared by the snapshot tests, golden files and the loader fuzz
// target: the host fingerprint the golden state file was written for.
#pragma once

#include "snapshot/fingerprint.h"

namespace torpor_test {

inline torpor::HostFingerprint golden_host() {
  torpor::HostFingerprint fp;
  fp.host_kind = "pvm";
  fp.cpu_vendor = "GenuineIntel";
  fp.family = 6;
  fp.model = 143;
  fp.stepping = 8;
  fp.features = {0x7ffefbff, 0xbfebfbff, 0xf1bf07ab, 0x1b417fde, 0xbc040412, 0x0000000f, 0x00000121, 0x2c100800};
  fp.tsc_khz = 2000000;
  fp.kvm_api = 12;
  fp.kvm_module_id = "0123456789ABCDEF0123456";
  return fp;
}

}  // namespace torpor_test
