#include "vmm/x86_64/mptable.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "common/error.h"
#include "vmm/x86_64/layout.h"

namespace torpor::x86 {

namespace {

constexpr uint8_t kSpecRev = 4;  // MP spec 1.4
constexpr uint8_t kApicVersion = 0x14;
constexpr uint8_t kIoapicVersion = 0x11;

enum EntryType : uint8_t { kProcessor = 0, kBus = 1, kIoapic = 2, kIoInterrupt = 3, kLocalInterrupt = 4 };
enum IrqType : uint8_t { kInt = 0, kNmi = 1, kExtInt = 3 };

struct Writer {
  std::vector<uint8_t> b;
  void u8(uint8_t v) { b.push_back(v); }
  void u16(uint16_t v) { u8(v & 0xff), u8(v >> 8); }
  void u32(uint32_t v) { u16(v & 0xffff), u16(v >> 16); }
  void chars(const char* s, size_t n) {
    size_t len = std::strlen(s);
    for (size_t i = 0; i < n; i++) u8(i < len ? static_cast<uint8_t>(s[i]) : ' ');
  }
};

uint8_t checksum(const uint8_t* p, size_t n) {
  uint8_t sum = 0;
  for (size_t i = 0; i < n; i++) sum = static_cast<uint8_t>(sum + p[i]);
  return static_cast<uint8_t>(-sum);
}

std::set<uint32_t> irq_list(const std::vector<uint32_t>& device_gsis) {
  std::set<uint32_t> irqs;
  for (uint32_t i = 0; i < 16; i++) irqs.insert(i);
  for (uint32_t g : device_gsis) irqs.insert(g);
  return irqs;
}

std::vector<uint8_t> build(uint64_t addr, uint32_t vcpus, const std::vector<uint32_t>& device_gsis) {
  const uint8_t ioapic_id = static_cast<uint8_t>(vcpus);
  const auto irqs = irq_list(device_gsis);
  const uint64_t table_addr = addr + 16;

  Writer t;  // the configuration table
  t.chars("PCMP", 4);
  t.u16(0);  // length, patched below
  t.u8(kSpecRev);
  t.u8(0);  // checksum, patched below
  t.chars("TORPOR", 8);
  t.chars("MICROVM", 12);
  t.u32(0);  // OEM table pointer
  t.u16(0);  // OEM table size
  t.u16(0);  // entry count, patched below
  t.u32(static_cast<uint32_t>(kLapicAddr));
  t.u16(0);  // extended table length
  t.u8(0);   // extended table checksum
  t.u8(0);
  uint16_t entries = 0;
  for (uint32_t cpu = 0; cpu < vcpus; cpu++, entries++) {
    t.u8(kProcessor);
    t.u8(static_cast<uint8_t>(cpu));
    t.u8(kApicVersion);
    t.u8(static_cast<uint8_t>(0x01 | (cpu == 0 ? 0x02 : 0)));  // enabled, BSP
    t.u32(0x600);                                              // family 6 signature
    t.u32(0x201);                                              // FPU | APIC
    t.u32(0);
    t.u32(0);
  }
  t.u8(kBus), t.u8(0), t.chars("ISA", 6), entries++;
  t.u8(kIoapic), t.u8(ioapic_id), t.u8(kIoapicVersion), t.u8(1), t.u32(static_cast<uint32_t>(kIoapicAddr)), entries++;
  for (uint32_t irq : irqs) {
    // Flags 0: conforms to the bus, i.e. edge-triggered, active high for ISA,
    // which is what the 8250, the PIT and the virtio-mmio irqfds need.
    t.u8(kIoInterrupt), t.u8(kInt), t.u16(0), t.u8(0), t.u8(static_cast<uint8_t>(irq)), t.u8(ioapic_id),
        t.u8(static_cast<uint8_t>(irq));
    entries++;
  }
  t.u8(kLocalInterrupt), t.u8(kExtInt), t.u16(0), t.u8(0), t.u8(0), t.u8(0), t.u8(0), entries++;
  t.u8(kLocalInterrupt), t.u8(kNmi), t.u16(0), t.u8(0), t.u8(0), t.u8(0xff), t.u8(1), entries++;

  uint16_t len = static_cast<uint16_t>(t.b.size());
  std::memcpy(&t.b[4], &len, 2);
  std::memcpy(&t.b[34], &entries, 2);
  t.b[7] = checksum(t.b.data(), t.b.size());

  Writer f;  // the floating pointer structure, right before the table
  f.chars("_MP_", 4);
  f.u32(static_cast<uint32_t>(table_addr));
  f.u8(1);  // length in 16-byte units
  f.u8(kSpecRev);
  f.u8(0);  // checksum
  for (int i = 0; i < 5; i++) f.u8(0);  // feature bytes: table present, no default config
  f.b[10] = checksum(f.b.data(), f.b.size());

  std::vector<uint8_t> out = std::move(f.b);
  out.insert(out.end(), t.b.begin(), t.b.end());
  return out;
}

}  // namespace

uint64_t mptable_size(uint32_t vcpus, const std::vector<uint32_t>& device_gsis) {
  return build(0, vcpus, device_gsis).size();
}

void write_mptable(GuestMemory& mem, uint64_t addr, uint32_t vcpus, const std::vector<uint32_t>& device_gsis) {
  if (vcpus == 0 || vcpus > 254) throw Error(code::kInvalidArgument, "MP table: vCPU count must be 1..254");
  for (uint32_t g : device_gsis)
    if (g > 23) throw Error(code::kInvalidArgument, "MP table: GSI " + std::to_string(g) + " beyond the IOAPIC's 24 pins");
  auto bytes = build(addr, vcpus, device_gsis);
  if (addr + bytes.size() > kHighMemStart || !mem.write(addr, bytes.data(), bytes.size()))
    throw Error(code::kBootFailed, "MP table does not fit below 1 MiB");
}

}  // namespace torpor::x86
