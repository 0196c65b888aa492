#include "snapshot/fingerprint.h"

#include <cstdio>

namespace torpor {
namespace {

constexpr const char* kTag = "fingerprint";
constexpr uint32_t kVersion = 1;

// Names of the feature words, in the order HostFingerprint::features holds them.
const char* feature_word_name(size_t i) {
  static constexpr const char* kNames[] = {"CPUID.1:ECX",   "CPUID.1:EDX",    "CPUID.7.0:EBX",
                                           "CPUID.7.0:ECX", "CPUID.7.0:EDX",  "CPUID.0xD.1:EAX",
                                           "CPUID.0x80000001:ECX", "CPUID.0x80000001:EDX"};
  return i < std::size(kNames) ? kNames[i] : "CPUID word";
}

[[noreturn]] void incompatible(const std::string& why) {
  throw Error(code::kSnapshotIncompatible, "snapshot was taken on an incompatible host: " + why);
}

}  // namespace

void write_fingerprint(StateWriter& w, const HostFingerprint& fp) {
  w.header(kTag, kVersion);
  w.str(fp.host_kind);
  w.str(fp.cpu_vendor);
  w.u32(fp.family);
  w.u32(fp.model);
  w.u32(fp.stepping);
  w.u32(static_cast<uint32_t>(fp.features.size()));
  for (uint32_t word : fp.features) w.u32(word);
  w.u32(fp.tsc_khz);
  w.u32(fp.kvm_api);
  w.str(fp.kvm_module_id);
}

HostFingerprint read_fingerprint(StateReader& r) {
  r.expect_header(kTag, kVersion, kVersion);
  HostFingerprint fp;
  fp.host_kind = r.str(kMaxFingerprintString);
  fp.cpu_vendor = r.str(kMaxFingerprintString);
  fp.family = r.u32();
  fp.model = r.u32();
  fp.stepping = r.u32();
  uint32_t n = r.u32();
  if (n > kMaxFingerprintFeatures) StateReader::fail("fingerprint has too many feature words");
  fp.features.resize(n);
  for (uint32_t& word : fp.features) word = r.u32();
  fp.tsc_khz = r.u32();
  fp.kvm_api = r.u32();
  fp.kvm_module_id = r.str(kMaxFingerprintString);
  if (fp.host_kind != "hardware" && fp.host_kind != "pvm")
    StateReader::fail("fingerprint names an unknown host kind '" + fp.host_kind + "'");
  return fp;
}

void check_compatible(const HostFingerprint& saved, const HostFingerprint& here) {
  if (saved.host_kind != here.host_kind)
    incompatible("it was taken on a " + saved.host_kind + " host and this is a " + here.host_kind +
                 " host (PVM and hardware-virtualization snapshots never interchange)");
  if (saved.cpu_vendor != here.cpu_vendor)
    incompatible("CPU vendor " + saved.cpu_vendor + " there, " + here.cpu_vendor + " here");
  if (saved.features.size() != here.features.size())
    incompatible("the hosts describe CPU features differently (" + std::to_string(saved.features.size()) +
                 " words there, " + std::to_string(here.features.size()) + " here)");
  for (size_t i = 0; i < saved.features.size(); i++) {
    uint32_t missing = saved.features[i] & ~here.features[i];
    if (missing) {
      int bit = __builtin_ctz(missing);
      incompatible(std::string("this CPU lacks feature ") + feature_word_name(i) + " bit " + std::to_string(bit) +
                   " that the snapshot's CPU had");
    }
  }
  if (saved.tsc_khz != here.tsc_khz)
    incompatible("TSC frequency " + std::to_string(saved.tsc_khz) + " kHz there, " + std::to_string(here.tsc_khz) +
                 " kHz here");
  if (saved.kvm_api != here.kvm_api)
    incompatible("KVM API version " + std::to_string(saved.kvm_api) + " there, " + std::to_string(here.kvm_api) +
                 " here");
  if (saved.kvm_module_id != here.kvm_module_id)
    incompatible("KVM module '" + saved.kvm_module_id + "' there, '" + here.kvm_module_id + "' here");
}

}  // namespace torpor
