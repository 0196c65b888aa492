// KVM-free tests of the x86 boot pieces: e820, MP table, kernel loading (PVH
// ELF, ELF64, bzImage) over fake guest memory, with malformed images that
// must be refused (BOOT_FAILED) without touching memory out of bounds (ASan),
// and the CPUID adjustments.
#include <elf.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "test/check.h"
#include "base/guest_memory.h"
#include "vmm/x86_64/boot.h"
#include "vmm/x86_64/cpuid.h"
#include "vmm/x86_64/e820.h"
#include "vmm/x86_64/kernel_loader.h"
#include "vmm/x86_64/layout.h"
#include "vmm/x86_64/mptable.h"

using namespace torpor;
using namespace torpor::x86;

namespace {

struct FakeRam {
  explicit FakeRam(uint64_t bytes) : buf(bytes, 0), mem({MemoryRegion{0, bytes, buf.data()}}) {}
  std::vector<uint8_t> buf;
  GuestMemory mem;
};

template <typename T>
void put(std::vector<uint8_t>& b, size_t off, T v) {
  if (b.size() < off + sizeof(T)) b.resize(off + sizeof(T));
  std::memcpy(b.data() + off, &v, sizeof(T));
}

// ELF32 with one PT_LOAD of `code` at addr and (optionally) a PVH note.
std::vector<uint8_t> pvh_elf(const std::vector<uint8_t>& code, uint32_t addr, bool note = true) {
  std::vector<uint8_t> f(0x100 + code.size(), 0);
  std::memcpy(f.data(), ELFMAG, SELFMAG);
  f[EI_CLASS] = ELFCLASS32;
  f[EI_DATA] = ELFDATA2LSB;
  f[EI_VERSION] = 1;
  put<uint16_t>(f, 16, ET_EXEC);
  put<uint16_t>(f, 18, EM_386);
  put<uint32_t>(f, 24, addr);
  put<uint32_t>(f, 28, 52);
  put<uint16_t>(f, 42, sizeof(Elf32_Phdr));
  put<uint16_t>(f, 44, note ? 2 : 1);
  Elf32_Phdr load{};
  load.p_type = PT_LOAD;
  load.p_offset = 0x100;
  load.p_paddr = load.p_vaddr = addr;
  load.p_filesz = static_cast<uint32_t>(code.size());
  load.p_memsz = static_cast<uint32_t>(code.size()) + 64;
  std::memcpy(f.data() + 52, &load, sizeof(load));
  if (note) {
    Elf32_Phdr n{};
    n.p_type = PT_NOTE;
    n.p_offset = 0xc0;
    n.p_filesz = 20;
    std::memcpy(f.data() + 52 + sizeof(load), &n, sizeof(n));
    put<uint32_t>(f, 0xc0, 4);
    put<uint32_t>(f, 0xc4, 4);
    put<uint32_t>(f, 0xc8, 18);
    std::memcpy(f.data() + 0xcc, "Xen", 4);
    put<uint32_t>(f, 0xd0, addr);
  }
  std::memcpy(f.data() + 0x100, code.data(), code.size());
  return f;
}

std::vector<uint8_t> bz_image(uint16_t version = 0x020f, uint16_t xloadflags = 1) {
  std::vector<uint8_t> f(1024 + 0x200 + 16, 0x90);
  std::memset(f.data(), 0, 1024);
  f[0x1f1] = 1;
  put<uint16_t>(f, 0x1fe, 0xaa55);
  f[0x200] = 0xeb;
  f[0x201] = 0x268 - 0x202;
  std::memcpy(f.data() + 0x202, "HdrS", 4);
  put<uint16_t>(f, 0x206, version);
  f[0x211] = 1;
  put<uint32_t>(f, 0x22c, 0x37ffffff);
  put<uint16_t>(f, 0x236, xloadflags);
  put<uint32_t>(f, 0x238, 255);
  put<uint64_t>(f, 0x258, 0x1000000);
  put<uint32_t>(f, 0x260, 0x10000);
  return f;
}

}  // namespace

TEST("x86 e820: holes at the EBDA and at 3 GiB") {
  auto small = build_e820(64 << 20);
  CHECK_EQ(small.size(), size_t{3});
  CHECK_EQ(small[0].size, kEbdaStart);
  CHECK(small[1].type == E820Type::Reserved);
  CHECK_EQ(small[2].addr + small[2].size, uint64_t{64 << 20});
  auto big = build_e820(4 * kGiB);
  CHECK_EQ(big.size(), size_t{4});
  CHECK_EQ(big[2].addr + big[2].size, kMmioHoleStart);
  CHECK_EQ(big[3].addr, kMmioHoleEnd);
  CHECK_EQ(big[3].size, kGiB);
}

TEST("x86 mptable: checksums, one CPU entry per vCPU, every ISA IRQ and device GSI") {
  FakeRam ram(2 << 20);
  write_mptable(ram.mem, kMptableAddr, 4, {5, 6, 20});
  const uint8_t* fp = ram.buf.data() + kMptableAddr;
  CHECK(std::memcmp(fp, "_MP_", 4) == 0);
  uint8_t sum = 0;
  for (int i = 0; i < 16; i++) sum = static_cast<uint8_t>(sum + fp[i]);
  CHECK_EQ(sum, 0);
  uint32_t table;
  std::memcpy(&table, fp + 4, 4);
  const uint8_t* t = ram.buf.data() + table;
  CHECK(std::memcmp(t, "PCMP", 4) == 0);
  uint16_t len, count;
  std::memcpy(&len, t + 4, 2);
  std::memcpy(&count, t + 34, 2);
  sum = 0;
  for (int i = 0; i < len; i++) sum = static_cast<uint8_t>(sum + t[i]);
  CHECK_EQ(sum, 0);
  int cpus = 0, irqs = 0;
  bool gsi20 = false;
  const uint8_t* e = t + 44;
  for (int i = 0; i < count; i++) {
    if (e[0] == 0) {
      CHECK_EQ(e[1], cpus);
      cpus++;
      e += 20;
    } else {
      if (e[0] == 3) {
        irqs++;
        if (e[7] == 20) gsi20 = true;
      }
      e += 8;
    }
  }
  CHECK_EQ(cpus, 4);
  CHECK_EQ(irqs, 17);  // 0..15 plus 20 (5 and 6 are ISA IRQs already)
  CHECK(gsi20);
  const std::vector<uint32_t> none, too_high(1, 24);
  CHECK_THROWS_CODE(write_mptable(ram.mem, kMptableAddr, 0, none), "INVALID_ARGUMENT");
  CHECK_THROWS_CODE(write_mptable(ram.mem, kMptableAddr, 2, too_high), "INVALID_ARGUMENT");
}

TEST("x86 kernel: PVH ELF32 loads at its physical address and enters at the note") {
  FakeRam ram(16 << 20);
  std::vector<uint8_t> code = {0xf4, 0xeb, 0xfd};
  auto k = load_kernel_image(ram.mem, pvh_elf(code, 0x100000), 16 << 20);
  CHECK(k.mode == EntryMode::Pvh32);
  CHECK_EQ(k.entry, uint64_t{0x100000});
  CHECK_EQ(k.end, uint64_t{0x100000 + 3 + 64});
  CHECK_EQ(ram.buf[0x100000], 0xf4);
}

TEST("x86 kernel: 32-bit ELF without a note is refused, ELF64 without one takes the 64-bit path") {
  FakeRam ram(16 << 20);
  auto no_note = pvh_elf(std::vector<uint8_t>(1, 0x90), 0x100000, false);
  CHECK_THROWS_CODE(load_kernel_image(ram.mem, no_note, 16 << 20), "BOOT_FAILED");
}

TEST("x86 kernel: bzImage checks protocol version and XLF_KERNEL_64") {
  FakeRam ram(32 << 20);
  auto k = load_kernel_image(ram.mem, bz_image(), 32 << 20);
  CHECK(k.is_bzimage);
  CHECK_EQ(k.entry, uint64_t{0x1000200});
  CHECK_EQ(k.cmdline_size, 255u);
  CHECK_THROWS_CODE(load_kernel_image(ram.mem, bz_image(0x020b), 32 << 20), "BOOT_FAILED");
  CHECK_THROWS_CODE(load_kernel_image(ram.mem, bz_image(0x020f, 0), 32 << 20), "BOOT_FAILED");
  // init_size larger than RAM
  auto huge = bz_image();
  put<uint32_t>(huge, 0x260, 0xfffffff0);
  CHECK_THROWS_CODE(load_kernel_image(ram.mem, huge, 32 << 20), "BOOT_FAILED");
  // A kernel shorter than its 64-bit entry offset, placed at the top of RAM:
  // the entry would lie beyond RAM (a fuzz finding).
  auto short_kernel = bz_image();
  short_kernel.resize(1024 + 0x100);
  put<uint32_t>(short_kernel, 0x260, 0x100);
  put<uint64_t>(short_kernel, 0x258, (32 << 20) - 0x100);
  CHECK_THROWS_CODE(load_kernel_image(ram.mem, short_kernel, 32 << 20), "BOOT_FAILED");
}

TEST("x86 kernel: corrupted images are refused or loaded, never read out of bounds") {
  // Flip bytes of the headers at random: every outcome is a load or a
  // BOOT_FAILED; ASan/UBSan catch any out-of-bounds read or write.
  std::mt19937 rng(1234);
  FakeRam ram(8 << 20);
  auto good = pvh_elf({0x90, 0xf4}, 0x100000);
  auto bz = bz_image();
  int refused = 0;
  for (int round = 0; round < 4000; round++) {
    auto img = (round & 1) ? bz : good;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; i++) img[rng() % std::min<size_t>(img.size(), 0x270)] = static_cast<uint8_t>(rng());
    if (rng() % 8 == 0) img.resize(rng() % img.size());
    try {
      load_kernel_image(ram.mem, img, 8 << 20);
    } catch (const Error& e) {
      CHECK(std::string(e.code()) == "BOOT_FAILED");
      refused++;
    }
  }
  CHECK(refused > 100);
}

TEST("x86 boot: PVH start info, command line and memory map in guest memory") {
  FakeRam ram(32 << 20);
  BootConfig cfg;
  cfg.cmdline = "console=ttyS0 quiet";
  cfg.ram_bytes = 32 << 20;
  cfg.vcpus = 2;
  const auto image = pvh_elf(std::vector<uint8_t>(1, 0xf4), 0x100000);
  auto entry = load_boot_image(ram.mem, cfg, image);
  CHECK(entry.mode == EntryMode::Pvh32);
  CHECK_EQ(entry.boot_info, kStartInfoAddr);
  uint32_t magic;
  std::memcpy(&magic, ram.buf.data() + kStartInfoAddr, 4);
  CHECK_EQ(magic, 0x336ec578u);
  uint64_t cmdline;
  std::memcpy(&cmdline, ram.buf.data() + kStartInfoAddr + 24, 8);
  CHECK(std::strcmp(reinterpret_cast<const char*>(ram.buf.data() + cmdline), "console=ttyS0 quiet") == 0);
  uint32_t entries;
  std::memcpy(&entries, ram.buf.data() + kStartInfoAddr + 48, 4);
  CHECK_EQ(entries, 3u);
  cfg.cmdline.assign(kCmdlineMax, 'x');
  CHECK_THROWS_CODE(load_boot_image(ram.mem, cfg, image), "BOOT_FAILED");
}

TEST("x86 cpuid: APIC ids per vCPU, hypervisor bit, PMU off, features masked without their MSR") {
  std::vector<kvm_cpuid_entry2> supported(5);
  std::memset(supported.data(), 0, supported.size() * sizeof(kvm_cpuid_entry2));
  supported[0].function = 1;
  supported[0].ebx = 0x00010800;
  supported[1].function = 7;
  supported[1].ebx = 0x2;
  supported[1].edx = (1u << 29) | (1u << 26);
  supported[2].function = 0xa;
  supported[2].eax = 0x7300403;
  supported[3].function = 0xb;
  supported[3].index = 1;
  supported[4].function = 0x40000000;
  supported[4].ebx = 0x12345678;
  MsrSupport none;
  auto out = build_cpuid(supported, 3, 4, HostKind::Pvm, none);
  CHECK_EQ(out[0].ebx >> 24, 3u);
  CHECK_EQ((out[0].ebx >> 16) & 0xff, 4u);
  CHECK(out[0].ecx & (1u << 31));
  CHECK_EQ(out[1].ebx & 0x2, 0u);
  CHECK_EQ(out[1].edx, 0u);
  CHECK_EQ(out[2].eax, 0u);
  CHECK_EQ(out[3].edx, 3u);
  CHECK_EQ(out[3].ebx, 4u);
  CHECK_EQ(out[4].ebx, 0x12345678u);  // PVM: hypervisor leaves pass through
  MsrSupport all;
  all.arch_capabilities = all.tsc_adjust = all.spec_ctrl = all.xss = true;
  auto hw = build_cpuid(supported, 0, 1, HostKind::Hardware, all);
  CHECK_EQ(hw[1].edx, (1u << 29) | (1u << 26));
  CHECK(std::memcmp(&hw[4].ebx, "KVMK", 4) == 0);
}
