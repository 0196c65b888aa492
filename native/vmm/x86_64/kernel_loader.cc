#include "vmm/x86_64/kernel_loader.h"

#include <elf.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "vmm/x86_64/layout.h"

namespace torpor::x86 {

namespace {

constexpr uint32_t kXenElfnotePhys32Entry = 18;
constexpr uint16_t kMinBootProtocol = 0x020c;  // 2.12: xloadflags
constexpr uint16_t kXlfKernel64 = 1 << 0;
constexpr uint32_t kHdrSMagic = 0x53726448;  // "HdrS"
constexpr uint64_t kMaxNoteBytes = 64 * 1024;  // a kernel's notes take a few hundred bytes
constexpr uint64_t kHugePage = 2 << 20;
constexpr uint64_t kBzImageEntry64 = 0x200;  // boot protocol: startup_64 at the load address + 0x200

[[noreturn]] void bad(const std::string& why) { throw Error(code::kBootFailed, "kernel: " + why); }

template <typename T>
T get(const ImageSource& img, uint64_t off) {
  if (!img.contains(off, sizeof(T))) bad("truncated (offset " + std::to_string(off) + ")");
  T v;
  img.read(off, &v, sizeof(T));
  return v;
}

// Where the loader puts things and what it may assume about the RAM there.
struct Placer {
  GuestMemory& mem;
  const ImageSource& img;
  uint64_t ram_top;
  bool fresh_ram;
  uint64_t end = 0;  // first byte above everything placed
  struct Range {
    uint64_t begin, end;
  };
  std::vector<Range> placed;

  bool overlaps_placed(uint64_t begin, uint64_t stop) const {
    for (const auto& r : placed)
      if (begin < r.end && r.begin < stop) return true;
    return false;
  }

  // Places [paddr, paddr + memsz) in RAM above the boot structures, reading
  // filesz bytes from the image straight into guest RAM and zeroing the rest.
  void place(uint64_t paddr, uint64_t offset, uint64_t filesz, uint64_t memsz) {
    if (filesz > memsz) bad("segment file size exceeds its memory size");
    if (!img.contains(offset, filesz)) bad("segment lies outside the file");
    if (paddr < kHighMemStart) bad("segment below 1 MiB (0x" + std::to_string(paddr) + ")");
    if (paddr + memsz < paddr || paddr + memsz > ram_top)
      bad("segment at " + std::to_string(paddr) + " (+" + std::to_string(memsz) + " bytes) does not fit in guest RAM");
    uint8_t* dst = mem.host_ptr(paddr, memsz);  // the one bounds check for the whole segment
    if (!dst) bad("segment outside guest memory");
    if (fresh_ram) advise_huge_pages(mem, paddr, memsz);
    img.read(offset, dst, filesz);
    // Fresh RAM reads as zero already: writing zeros there would only fault
    // its pages in. Unless an earlier segment overlaps (a malformed image).
    uint64_t zero = memsz - filesz;
    if (zero && (!fresh_ram || overlaps_placed(paddr + filesz, paddr + memsz))) std::memset(dst + filesz, 0, zero);
    mem.mark_dirty(paddr, memsz);
    placed.push_back({paddr, paddr + memsz});
    if (paddr + memsz > end) end = paddr + memsz;
  }
};

// Finds the PVH entry in a PT_NOTE segment; 0 when absent.
uint64_t find_pvh_note(const ImageSource& img, uint64_t off, uint64_t size) {
  if (size > kMaxNoteBytes) bad("ELF note segment of " + std::to_string(size) + " bytes");
  std::vector<uint8_t> notes(size);
  img.read(off, notes.data(), notes.size());
  BufferImage n(notes);
  uint64_t p = 0, end = size;
  while (p + 12 <= end) {
    uint32_t namesz = get<uint32_t>(n, p), descsz = get<uint32_t>(n, p + 4), type = get<uint32_t>(n, p + 8);
    uint64_t name_off = p + 12;
    uint64_t desc_off = name_off + ((uint64_t{namesz} + 3) & ~uint64_t{3});
    uint64_t next = desc_off + ((uint64_t{descsz} + 3) & ~uint64_t{3});
    if (next > end || next <= p) break;  // malformed: stop looking
    if (type == kXenElfnotePhys32Entry && namesz == 4 && std::memcmp(notes.data() + name_off, "Xen", 4) == 0) {
      if (descsz == 4) return get<uint32_t>(n, desc_off);
      if (descsz == 8) return get<uint64_t>(n, desc_off);
      bad("PVH note with a descriptor of " + std::to_string(descsz) + " bytes");
    }
    p = next;
  }
  return 0;
}

template <typename Ehdr, typename Phdr>
LoadedKernel load_elf(Placer& placer) {
  const ImageSource& img = placer.img;
  auto eh = get<Ehdr>(img, 0);
  if (eh.e_machine != EM_X86_64 && eh.e_machine != EM_386) bad("ELF for another machine (" + std::to_string(eh.e_machine) + ")");
  if (eh.e_phentsize != sizeof(Phdr)) bad("unexpected ELF program header size");
  if (eh.e_phnum == 0 || eh.e_phnum > 256) bad("ELF with " + std::to_string(eh.e_phnum) + " program headers");
  if (!img.contains(eh.e_phoff, uint64_t{eh.e_phnum} * sizeof(Phdr))) bad("ELF program headers outside the file");
  std::vector<Phdr> phdrs(eh.e_phnum);
  img.read(eh.e_phoff, phdrs.data(), phdrs.size() * sizeof(Phdr));

  LoadedKernel k;
  uint64_t pvh_entry = 0;
  bool loaded = false;
  for (const Phdr& ph : phdrs) {
    if (ph.p_type == PT_LOAD && ph.p_memsz > 0) {
      placer.place(ph.p_paddr, ph.p_offset, ph.p_filesz, ph.p_memsz);
      loaded = true;
    } else if (ph.p_type == PT_NOTE) {
      if (!img.contains(ph.p_offset, ph.p_filesz)) bad("ELF note outside the file");
      if (!pvh_entry) pvh_entry = find_pvh_note(img, ph.p_offset, ph.p_filesz);
    }
  }
  if (!loaded) bad("ELF has nothing to load");
  k.end = placer.end;
  if (pvh_entry) {
    if (pvh_entry >= kMmioHoleStart) bad("PVH entry beyond 4 GiB");
    k.mode = EntryMode::Pvh32;
    k.entry = pvh_entry;
  } else {
    if (eh.e_ident[EI_CLASS] != ELFCLASS64) bad("32-bit ELF without a PVH note: nothing to enter");
    k.mode = EntryMode::Linux64;
    k.entry = eh.e_entry;
  }
  if (k.entry < kHighMemStart || k.entry >= k.end) bad("entry point outside the loaded image");
  return k;
}

LoadedKernel load_bzimage(Placer& placer) {
  const ImageSource& img = placer.img;
  uint16_t version = get<uint16_t>(img, 0x206);
  if (version < kMinBootProtocol)
    bad("bzImage boot protocol " + std::to_string(version >> 8) + "." + std::to_string(version & 0xff) +
        " is older than 2.12");
  uint16_t xloadflags = get<uint16_t>(img, 0x236);
  if (!(xloadflags & kXlfKernel64)) bad("bzImage has no 64-bit entry point (XLF_KERNEL_64)");
  uint8_t loadflags = get<uint8_t>(img, 0x211);
  if (!(loadflags & 0x01)) bad("bzImage is not loaded high (LOADED_HIGH clear)");
  uint32_t setup_sects = get<uint8_t>(img, 0x1f1);
  if (setup_sects == 0) setup_sects = 4;
  uint64_t kernel_off = (uint64_t{setup_sects} + 1) * 512;
  if (kernel_off >= img.size()) bad("bzImage has no protected-mode kernel");
  uint64_t kernel_size = img.size() - kernel_off;
  // The 64-bit entry (startup_64) lies 0x200 into the protected-mode kernel:
  // a shorter kernel would put the entry point past what was loaded, even
  // past the end of RAM (found by the kernel_loader fuzz target).
  if (kernel_size <= kBzImageEntry64) bad("bzImage kernel of " + std::to_string(kernel_size) + " bytes has no 64-bit entry");
  // The setup header runs from 0x1f1 to 0x202 + the byte at 0x201.
  uint64_t hdr_end = 0x202 + uint64_t{get<uint8_t>(img, 0x201)};
  if (!img.contains(0x1f1, hdr_end - 0x1f1)) bad("bzImage setup header truncated");

  uint64_t load = get<uint64_t>(img, 0x258);  // pref_address
  if (load < kHighMemStart) load = kHighMemStart;
  uint32_t init_size = get<uint32_t>(img, 0x260);
  uint64_t span = std::max<uint64_t>(kernel_size, init_size);
  if (load + span < load || load + span > placer.ram_top)
    bad("bzImage needs " + std::to_string(span) + " bytes at " + std::to_string(load) + ": more than guest RAM");
  LoadedKernel k;
  placer.place(load, kernel_off, kernel_size, kernel_size);
  k.end = load + span;
  k.mode = EntryMode::Linux64;
  k.entry = load + kBzImageEntry64;
  k.is_bzimage = true;
  k.setup_header.resize(hdr_end - 0x1f1);
  img.read(0x1f1, k.setup_header.data(), k.setup_header.size());
  k.boot_protocol = version;
  k.initrd_addr_max = get<uint32_t>(img, 0x22c);
  k.cmdline_size = get<uint32_t>(img, 0x238);
  return k;
}

}  // namespace

void advise_huge_pages(GuestMemory& mem, uint64_t gpa, uint64_t len) {
  // Filling never-touched RAM costs one page fault per 4 KiB page (~4-7 us
  // each on a PVM host, where the host kernel itself runs virtualised: 16 MB
  // of kernel, ~25 ms). With transparent huge pages that is one fault per
  // 2 MiB. Advice only: refused or ignored where THP is off.
  if (len == 0) return;
  if (!mem.contains(gpa, len)) return;
  uint64_t begin = gpa & ~(kHugePage - 1);
  uint64_t end = (gpa + len + kHugePage - 1) & ~(kHugePage - 1);  // RAM ends far below 2^64
  uint8_t* p = mem.host_ptr(begin, end - begin);
  if (!p) {  // widened past the region's edge: the range itself
    begin = gpa & ~(kPageSize - 1);
    end = gpa + len;
    p = mem.host_ptr(begin, end - begin);
    if (!p) return;
  }
  auto addr = reinterpret_cast<uintptr_t>(p);
  uintptr_t first = (addr + kPageSize - 1) & ~uintptr_t{kPageSize - 1};
  uintptr_t last = (addr + (end - begin)) & ~uintptr_t{kPageSize - 1};
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
}

LoadedKernel load_kernel_image(GuestMemory& mem, const ImageSource& img, uint64_t ram_top, bool fresh_ram) {
  Placer placer{mem, img, ram_top, fresh_ram};
  uint8_t ident[EI_NIDENT] = {};
  if (img.size() >= 4) img.read(0, ident, std::min<uint64_t>(img.size(), EI_NIDENT));
  if (img.size() >= 4 && std::memcmp(ident, ELFMAG, SELFMAG) == 0) {
    if (img.size() < EI_NIDENT) bad("truncated ELF header");
    if (ident[EI_DATA] != ELFDATA2LSB) bad("big-endian ELF");
    if (ident[EI_CLASS] == ELFCLASS64) return load_elf<Elf64_Ehdr, Elf64_Phdr>(placer);
    if (ident[EI_CLASS] == ELFCLASS32) return load_elf<Elf32_Ehdr, Elf32_Phdr>(placer);
    bad("unknown ELF class");
  }
  if (img.size() >= 0x206 && get<uint32_t>(img, 0x202) == kHdrSMagic && get<uint16_t>(img, 0x1fe) == 0xaa55)
    return load_bzimage(placer);
  bad("not an ELF kernel and not a bzImage");
}

LoadedKernel load_kernel_image(GuestMemory& mem, const std::vector<uint8_t>& image, uint64_t ram_top) {
  return load_kernel_image(mem, BufferImage(image), ram_top, false);
}

}  // namespace torpor::x86
