// The machine spec saved at the head of every snapshot: a round trip keeps
// every field, and a truncated or corrupted spec is refused (SNAPSHOT_INVALID),
// never read past its end.
#include "vmm/machine_spec.h"

#include "test/check.h"

using namespace torpor;

namespace {

MachineSpec sample() {
  MachineSpec s;
  s.host_kind = "pvm";
  s.config.kernel = "/k/vmlinux";
  s.config.cmdline = "console=ttyS0 testvm.count=1";
  s.config.vcpus = 2;
  s.config.memory_mib = 512;
  BlkOptions d;
  d.base_path = "/img/base.ext4";
  d.size_bytes = 1 << 20;
  d.serial = "root";
  d.frozen_overlays = {"gen-1/disk0.overlay", "/elsewhere/disk0.overlay"};
  s.config.disks.push_back(d);
  s.config.vsock_cid = 42;
  s.config.rng = true;
  s.config.net = NetOptions{"52:54:00:01:02:03", "/run/passt.sock"};
  s.config.console_ring_bytes = 4096;
  s.devices = {{"serial-8250", 0x3f8}, {"i8042", 0x60}, {"virtio-mmio-blk", 0xd0000000}};
  return s;
}

// Whether reading `bytes` back is refused with SNAPSHOT_INVALID.
bool refused_as_invalid(const uint8_t* bytes, size_t n) {
  StateReader r(bytes, n);
  try {
    read_machine_spec(r);
  } catch (const Error& e) {
    return std::string(e.code()) == code::kSnapshotInvalid;
  }
  return false;
}

bool spec_refused(const MachineSpec& spec) {
  StateWriter w;
  write_machine_spec(w, spec);
  return refused_as_invalid(w.data().data(), w.data().size());
}

}  // namespace

TEST("machine spec: round trip keeps every field") {
  StateWriter w;
  write_machine_spec(w, sample());
  StateReader r(w.data());
  MachineSpec s = read_machine_spec(r);
  r.expect_end();
  CHECK_STR_EQ(s.host_kind, "pvm");
  CHECK_STR_EQ(s.config.cmdline, "console=ttyS0 testvm.count=1");
  CHECK_EQ(s.config.vcpus, 2u);
  CHECK_EQ(s.config.memory_mib, 512u);
  CHECK_EQ(s.config.disks.size(), size_t{1});
  CHECK_EQ(s.config.disks[0].frozen_overlays.size(), size_t{2});
  CHECK_STR_EQ(s.config.disks[0].frozen_overlays[1], "/elsewhere/disk0.overlay");
  CHECK_EQ(s.config.disks[0].size_bytes, uint64_t{1} << 20);
  CHECK(s.config.vsock_cid.has_value());
  CHECK_EQ(*s.config.vsock_cid, uint64_t{42});
  CHECK(s.config.rng);
  CHECK(s.config.net.has_value());
  CHECK_STR_EQ(s.config.net->mac, "52:54:00:01:02:03");
  CHECK_STR_EQ(s.config.net->backend_socket, "");  // per run: never in a snapshot
  CHECK_EQ(s.devices.size(), size_t{3});
  CHECK_EQ(s.devices[2].second, uint64_t{0xd0000000});
}

TEST("machine spec: every truncation and bad counts are refused") {
  StateWriter w;
  write_machine_spec(w, sample());
  const auto& bytes = w.data();
  for (size_t n = 0; n < bytes.size(); n++) CHECK(refused_as_invalid(bytes.data(), n));
  MachineSpec bad = sample();
  bad.config.vcpus = 0;
  CHECK(spec_refused(bad));
}

TEST("machine spec: a bad network MAC is refused") {
  MachineSpec bad = sample();
  bad.config.net->mac = "01:00:5e:00:00:01";  // multicast
  CHECK(spec_refused(bad));
}
