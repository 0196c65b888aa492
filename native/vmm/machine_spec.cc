#include "vmm/machine_spec.h"

#include "devices/virtio/net/net_device.h"

namespace torpor {

namespace {
constexpr const char* kTag = "machine-spec";
// 2: the network device (its MAC).
constexpr uint32_t kVersion = 2;
constexpr size_t kMaxPath = 4096;
constexpr size_t kMaxCmdline = 64 * 1024;
constexpr uint32_t kMaxDevices = 64;
constexpr uint32_t kMaxFrozen = 4096;
}  // namespace

void write_machine_spec(StateWriter& out, const MachineSpec& spec) {
  const MachineConfig& c = spec.config;
  out.header(kTag, kVersion);
  out.str(spec.host_kind);
  out.u32(c.vcpus);
  out.u64(c.memory_mib);
  out.str(c.kernel);
  out.str(c.cmdline);
  out.u32(static_cast<uint32_t>(c.disks.size()));
  for (const auto& d : c.disks) {
    out.str(d.base_path);
    out.str(d.overlay_path);
    out.u64(d.size_bytes);
    out.boolean(d.read_only);
    out.str(d.serial);
    out.u32(static_cast<uint32_t>(d.frozen_overlays.size()));
    for (const auto& f : d.frozen_overlays) out.str(f);
  }
  out.boolean(c.vsock_cid.has_value());
  out.u64(c.vsock_cid.value_or(0));
  out.boolean(c.rng);
  out.u64(c.console_ring_bytes);
  out.boolean(c.net.has_value());
  out.str(c.net ? c.net->mac : std::string());
  out.u32(static_cast<uint32_t>(spec.devices.size()));
  for (const auto& [name, base] : spec.devices) {
    out.str(name);
    out.u64(base);
  }
}

MachineSpec read_machine_spec(StateReader& in) {
  uint32_t version = in.expect_header(kTag, 1, kVersion);
  MachineSpec s;
  MachineConfig& c = s.config;
  s.host_kind = in.str(16);
  c.vcpus = in.u32();
  if (c.vcpus < 1 || c.vcpus > 254) StateReader::fail("machine spec: bad vCPU count");
  c.memory_mib = in.u64();
  if (c.memory_mib < 2 || c.memory_mib > 1024 * 1024) StateReader::fail("machine spec: bad memory size");
  c.kernel = in.str(kMaxPath);
  c.cmdline = in.str(kMaxCmdline);
  uint32_t disks = in.u32();
  if (disks > kMaxDevices) StateReader::fail("machine spec: too many disks");
  for (uint32_t i = 0; i < disks; i++) {
    BlkOptions d;
    d.base_path = in.str(kMaxPath);
    d.overlay_path = in.str(kMaxPath);
    d.size_bytes = in.u64();
    d.read_only = in.boolean();
    d.serial = in.str(20);
    uint32_t frozen = in.u32();
    if (frozen > kMaxFrozen) StateReader::fail("machine spec: too many frozen disk layers");
    for (uint32_t j = 0; j < frozen; j++) d.frozen_overlays.push_back(in.str(kMaxPath));
    c.disks.push_back(std::move(d));
  }
  bool vsock = in.boolean();
  uint64_t cid = in.u64();
  if (vsock) {
    if (cid < 3 || cid > 0xfffffffeull) StateReader::fail("machine spec: bad vsock CID");
    c.vsock_cid = cid;
  }
  c.rng = in.boolean();
  c.console_ring_bytes = in.u64();
  if (c.console_ring_bytes == 0 || c.console_ring_bytes > (64u << 20)) StateReader::fail("machine spec: bad console ring");
  if (version >= 2) {
    bool net = in.boolean();
    std::string mac = in.str(17);
    if (net) {
      MacAddress parsed;
      if (!parse_mac(mac, &parsed)) StateReader::fail("machine spec: bad network MAC");
      c.net = NetOptions{mac, ""};  // the backend is attached per run
    }
  }
  uint32_t n = in.u32();
  if (n > kMaxDevices) StateReader::fail("machine spec: too many devices");
  for (uint32_t i = 0; i < n; i++) {
    std::string name = in.str(64);
    uint64_t base = in.u64();
    s.devices.emplace_back(std::move(name), base);
  }
  return s;
}

}  // namespace torpor
