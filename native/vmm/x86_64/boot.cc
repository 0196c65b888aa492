#include "vmm/x86_64/boot.h"

#include <cstring>

#include "common/error.h"
#include "vmm/x86_64/e820.h"
#include "vmm/x86_64/layout.h"
#include "vmm/x86_64/mptable.h"

namespace torpor::x86 {

namespace {

constexpr uint32_t kPvhMagic = 0x336ec578;

// Struct layouts of xen/include/public/arch-x86/hvm/start_info.h (version 1).
struct HvmStartInfo {
  uint32_t magic;
  uint32_t version;
  uint32_t flags;
  uint32_t nr_modules;
  uint64_t modlist_paddr;
  uint64_t cmdline_paddr;
  uint64_t rsdp_paddr;
  uint64_t memmap_paddr;
  uint32_t memmap_entries;
  uint32_t reserved;
};
static_assert(sizeof(HvmStartInfo) == 56);
struct HvmModlistEntry {
  uint64_t paddr;
  uint64_t size;
  uint64_t cmdline_paddr;
  uint64_t reserved;
};
static_assert(sizeof(HvmModlistEntry) == 32);
struct HvmMemmapEntry {
  uint64_t addr;
  uint64_t size;
  uint32_t type;
  uint32_t reserved;
};
static_assert(sizeof(HvmMemmapEntry) == 24);

// boot_params (the "zero page") offsets used here; see the kernel's
// Documentation/arch/x86/zero-page.rst and boot.rst.
constexpr uint64_t kBpExtRamdiskImage = 0x0c0;
constexpr uint64_t kBpExtRamdiskSize = 0x0c4;
constexpr uint64_t kBpExtCmdLinePtr = 0x0c8;
constexpr uint64_t kBpE820Entries = 0x1e8;
constexpr uint64_t kBpSetupHeader = 0x1f1;
constexpr uint64_t kBpBootFlag = 0x1fe;
constexpr uint64_t kBpHeader = 0x202;
constexpr uint64_t kBpTypeOfLoader = 0x210;
constexpr uint64_t kBpLoadflags = 0x211;
constexpr uint64_t kBpRamdiskImage = 0x218;
constexpr uint64_t kBpRamdiskSize = 0x21c;
constexpr uint64_t kBpCmdLinePtr = 0x228;
constexpr uint64_t kBpKernelAlignment = 0x230;
constexpr uint64_t kBpCmdlineSize = 0x238;
constexpr uint64_t kBpE820Table = 0x2d0;
constexpr uint64_t kBpE820Max = 128;

template <typename T>
void put(std::vector<uint8_t>& b, uint64_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

void write_or_fail(GuestMemory& mem, uint64_t gpa, const void* p, size_t n, const char* what) {
  if (!mem.write(gpa, p, n)) throw Error(code::kBootFailed, std::string(what) + " does not fit in guest memory");
}

// Loads the initrd at the top of low RAM, page aligned, above the kernel,
// reading the file straight into guest RAM.
void load_initrd(GuestMemory& mem, const BootConfig& cfg, uint64_t kernel_end, uint64_t max_end, uint64_t* addr,
                 uint64_t* size) {
  *addr = *size = 0;
  if (cfg.initrd_path.empty()) return;
  uint64_t top = std::min(ram_below_hole(cfg.ram_bytes), max_end);
  FileImage initrd(cfg.initrd_path, top, "initrd");
  uint64_t bytes = initrd.size();
  if (bytes == 0) throw Error(code::kBootFailed, "initrd " + cfg.initrd_path + " is empty");
  uint64_t at = (top - bytes) & ~(kPageSize - 1);
  if (bytes > top || at < kernel_end)
    throw Error(code::kBootFailed, "initrd " + cfg.initrd_path + " (" + std::to_string(bytes) +
                                       " bytes) does not fit in guest RAM above the kernel");
  uint8_t* dst = mem.host_ptr(at, bytes);
  if (!dst) throw Error(code::kBootFailed, "initrd does not fit in guest memory");
  if (cfg.fresh_ram) advise_huge_pages(mem, at, bytes);
  initrd.read(0, dst, bytes);
  mem.mark_dirty(at, bytes);
  *addr = at;
  *size = bytes;
}

void write_pvh(GuestMemory& mem, const BootConfig& cfg, uint64_t initrd_addr, uint64_t initrd_size) {
  auto map = build_e820(cfg.ram_bytes);
  std::vector<HvmMemmapEntry> entries;
  for (const auto& e : map) entries.push_back({e.addr, e.size, static_cast<uint32_t>(e.type), 0});
  write_or_fail(mem, kMemmapAddr, entries.data(), entries.size() * sizeof(HvmMemmapEntry), "PVH memory map");

  HvmStartInfo si{};
  si.magic = kPvhMagic;
  si.version = 1;
  si.cmdline_paddr = kCmdlineAddr;
  si.memmap_paddr = kMemmapAddr;
  si.memmap_entries = static_cast<uint32_t>(entries.size());
  if (initrd_size) {
    HvmModlistEntry mod{initrd_addr, initrd_size, 0, 0};
    write_or_fail(mem, kModlistAddr, &mod, sizeof(mod), "PVH module list");
    si.nr_modules = 1;
    si.modlist_paddr = kModlistAddr;
  }
  write_or_fail(mem, kStartInfoAddr, &si, sizeof(si), "PVH start info");
}

// GDT, identity page tables over the first 1 GiB (2 MiB pages) and the zero
// page for the 64-bit boot protocol.
void write_linux64(GuestMemory& mem, const BootConfig& cfg, const LoadedKernel& k, uint64_t initrd_addr,
                   uint64_t initrd_size) {
  const uint64_t pml4e = kPdptAddr | 0x03, pdpte = kPdAddr | 0x03;
  write_or_fail(mem, kPml4Addr, &pml4e, 8, "page tables");
  write_or_fail(mem, kPdptAddr, &pdpte, 8, "page tables");
  std::vector<uint64_t> pd(512);
  for (uint64_t i = 0; i < 512; i++) pd[i] = (i << 21) | 0x83;  // present, writable, 2 MiB
  write_or_fail(mem, kPdAddr, pd.data(), pd.size() * 8, "page tables");

  std::vector<uint8_t> zp(4096, 0);
  if (k.is_bzimage) std::memcpy(zp.data() + kBpSetupHeader, k.setup_header.data(), k.setup_header.size());
  put<uint16_t>(zp, kBpBootFlag, 0xaa55);
  put<uint32_t>(zp, kBpHeader, 0x53726448);
  put<uint8_t>(zp, kBpTypeOfLoader, 0xff);
  put<uint8_t>(zp, kBpLoadflags, static_cast<uint8_t>(zp[kBpLoadflags] | 0x01));  // LOADED_HIGH
  if (!k.is_bzimage) put<uint32_t>(zp, kBpKernelAlignment, 0x01000000);
  put<uint32_t>(zp, kBpCmdLinePtr, static_cast<uint32_t>(kCmdlineAddr));
  put<uint32_t>(zp, kBpExtCmdLinePtr, 0);
  put<uint32_t>(zp, kBpCmdlineSize, static_cast<uint32_t>(cfg.cmdline.size()));
  put<uint32_t>(zp, kBpRamdiskImage, static_cast<uint32_t>(initrd_addr));
  put<uint32_t>(zp, kBpRamdiskSize, static_cast<uint32_t>(initrd_size));
  put<uint32_t>(zp, kBpExtRamdiskImage, static_cast<uint32_t>(initrd_addr >> 32));
  put<uint32_t>(zp, kBpExtRamdiskSize, static_cast<uint32_t>(initrd_size >> 32));
  auto map = build_e820(cfg.ram_bytes);
  if (map.size() > kBpE820Max) throw Error(code::kBootFailed, "e820 map too long");
  zp[kBpE820Entries] = static_cast<uint8_t>(map.size());
  for (size_t i = 0; i < map.size(); i++) {
    uint64_t off = kBpE820Table + i * 20;
    put<uint64_t>(zp, off, map[i].addr);
    put<uint64_t>(zp, off + 8, map[i].size);
    put<uint32_t>(zp, off + 16, static_cast<uint32_t>(map[i].type));
  }
  write_or_fail(mem, kZeroPageAddr, zp.data(), zp.size(), "zero page");
}

}  // namespace

BootEntry load_boot_image(GuestMemory& mem, const BootConfig& cfg) {
  return load_boot_image(mem, cfg, FileImage(cfg.kernel_path, ram_below_hole(cfg.ram_bytes), "kernel"));
}

BootEntry load_boot_image(GuestMemory& mem, const BootConfig& cfg, const std::vector<uint8_t>& kernel) {
  return load_boot_image(mem, cfg, BufferImage(kernel));
}

BootEntry load_boot_image(GuestMemory& mem, const BootConfig& cfg, const ImageSource& kernel) {
  const uint64_t low_top = ram_below_hole(cfg.ram_bytes);
  LoadedKernel k = load_kernel_image(mem, kernel, low_top, cfg.fresh_ram);

  uint64_t cmdline_limit = kCmdlineMax;
  if (k.is_bzimage && k.cmdline_size) cmdline_limit = std::min<uint64_t>(cmdline_limit, uint64_t{k.cmdline_size} + 1);
  if (cfg.cmdline.size() + 1 > cmdline_limit)
    throw Error(code::kBootFailed, "command line of " + std::to_string(cfg.cmdline.size()) +
                                       " bytes is longer than the kernel accepts (" + std::to_string(cmdline_limit - 1) + ")");
  write_or_fail(mem, kCmdlineAddr, cfg.cmdline.c_str(), cfg.cmdline.size() + 1, "command line");

  uint64_t initrd_max_end = UINT64_MAX;
  if (k.is_bzimage && k.initrd_addr_max) initrd_max_end = uint64_t{k.initrd_addr_max} + 1;
  uint64_t initrd_addr = 0, initrd_size = 0;
  load_initrd(mem, cfg, k.end, initrd_max_end, &initrd_addr, &initrd_size);

  write_mptable(mem, kMptableAddr, cfg.vcpus, cfg.device_gsis);

  // Flat GDT matching the segment registers vcpu_init.cc loads (selectors
  // 0x08 code, 0x10 data, 0x18 TSS), so a guest reloading them sees the same.
  const uint64_t code = k.mode == EntryMode::Pvh32 ? 0x00cf9b000000ffff : 0x00af9b000000ffff;
  const uint64_t gdt[4] = {0, code, 0x00cf93000000ffff, 0x008f8b000000ffff};
  write_or_fail(mem, kGdtAddr, gdt, sizeof(gdt), "GDT");
  const uint64_t idt = 0;
  write_or_fail(mem, kIdtAddr, &idt, sizeof(idt), "IDT");

  BootEntry entry;
  entry.mode = k.mode;
  entry.rip = k.entry;
  if (k.mode == EntryMode::Pvh32) {
    write_pvh(mem, cfg, initrd_addr, initrd_size);
    entry.boot_info = kStartInfoAddr;
  } else {
    write_linux64(mem, cfg, k, initrd_addr, initrd_size);
    entry.boot_info = kZeroPageAddr;
  }
  return entry;
}

}  // namespace torpor::x86
