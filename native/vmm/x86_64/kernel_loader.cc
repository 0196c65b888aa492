#include "vmm/x86_64/kernel_loader.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "base/fd.h"
#include "vmm/x86_64/layout.h"

namespace torpor::x86 {

namespace {

constexpr uint32_t kXenElfnotePhys32Entry = 18;
constexpr uint16_t kMinBootProtocol = 0x020c;  // 2.12: xloadflags
constexpr uint16_t kXlfKernel64 = 1 << 0;
constexpr uint32_t kHdrSMagic = 0x53726448;  // "HdrS"

[[noreturn]] void bad(const std::string& why) { throw Error(code::kBootFailed, "kernel: " + why); }

// [off, off + len) inside a buffer of `size` bytes, without overflow.
bool in_file(uint64_t off, uint64_t len, uint64_t size) { return off <= size && len <= size - off; }

template <typename T>
T get(const std::vector<uint8_t>& img, uint64_t off) {
  if (!in_file(off, sizeof(T), img.size())) bad("truncated (offset " + std::to_string(off) + ")");
  T v;
  std::memcpy(&v, img.data() + off, sizeof(T));
  return v;
}

// Places [paddr, paddr + memsz) in RAM above the boot structures, copying
// filesz bytes from the file and zeroing the rest.
void place(GuestMemory& mem, const std::vector<uint8_t>& img, uint64_t paddr, uint64_t offset, uint64_t filesz,
           uint64_t memsz, uint64_t ram_top, uint64_t* end) {
  if (filesz > memsz) bad("segment file size exceeds its memory size");
  if (!in_file(offset, filesz, img.size())) bad("segment lies outside the file");
  if (paddr < kHighMemStart) bad("segment below 1 MiB (0x" + std::to_string(paddr) + ")");
  if (paddr + memsz < paddr || paddr + memsz > ram_top)
    bad("segment at " + std::to_string(paddr) + " (+" + std::to_string(memsz) + " bytes) does not fit in guest RAM");
  if (filesz && !mem.write(paddr, img.data() + offset, filesz)) bad("segment outside guest memory");
  uint64_t zero = memsz - filesz;
  if (zero) {
    uint8_t* p = mem.host_ptr(paddr + filesz, zero);
    if (!p) bad("segment outside guest memory");
    std::memset(p, 0, zero);
    mem.mark_dirty(paddr + filesz, zero);
  }
  if (paddr + memsz > *end) *end = paddr + memsz;
}

// Finds the PVH entry in a PT_NOTE segment's bytes; 0 when absent.
uint64_t find_pvh_note(const std::vector<uint8_t>& img, uint64_t off, uint64_t size) {
  uint64_t p = off, end = off + size;
  while (p + 12 <= end) {
    uint32_t namesz = get<uint32_t>(img, p), descsz = get<uint32_t>(img, p + 4), type = get<uint32_t>(img, p + 8);
    uint64_t name_off = p + 12;
    uint64_t desc_off = name_off + ((uint64_t{namesz} + 3) & ~uint64_t{3});
    uint64_t next = desc_off + ((uint64_t{descsz} + 3) & ~uint64_t{3});
    if (next > end || next <= p) break;  // malformed: stop looking
    if (type == kXenElfnotePhys32Entry && namesz == 4 && std::memcmp(img.data() + name_off, "Xen", 4) == 0) {
      if (descsz == 4) return get<uint32_t>(img, desc_off);
      if (descsz == 8) return get<uint64_t>(img, desc_off);
      bad("PVH note with a descriptor of " + std::to_string(descsz) + " bytes");
    }
    p = next;
  }
  return 0;
}

template <typename Ehdr, typename Phdr>
LoadedKernel load_elf(GuestMemory& mem, const std::vector<uint8_t>& img, uint64_t ram_top) {
  auto eh = get<Ehdr>(img, 0);
  if (eh.e_machine != EM_X86_64 && eh.e_machine != EM_386) bad("ELF for another machine (" + std::to_string(eh.e_machine) + ")");
  if (eh.e_phentsize != sizeof(Phdr)) bad("unexpected ELF program header size");
  if (eh.e_phnum == 0 || eh.e_phnum > 256) bad("ELF with " + std::to_string(eh.e_phnum) + " program headers");
  if (!in_file(eh.e_phoff, uint64_t{eh.e_phnum} * sizeof(Phdr), img.size())) bad("ELF program headers outside the file");

  LoadedKernel k;
  uint64_t pvh_entry = 0;
  bool loaded = false;
  for (unsigned i = 0; i < eh.e_phnum; i++) {
    auto ph = get<Phdr>(img, eh.e_phoff + uint64_t{i} * sizeof(Phdr));
    if (ph.p_type == PT_LOAD && ph.p_memsz > 0) {
      place(mem, img, ph.p_paddr, ph.p_offset, ph.p_filesz, ph.p_memsz, ram_top, &k.end);
      loaded = true;
    } else if (ph.p_type == PT_NOTE) {
      if (!in_file(ph.p_offset, ph.p_filesz, img.size())) bad("ELF note outside the file");
      if (!pvh_entry) pvh_entry = find_pvh_note(img, ph.p_offset, ph.p_filesz);
    }
  }
  if (!loaded) bad("ELF has nothing to load");
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

LoadedKernel load_bzimage(GuestMemory& mem, const std::vector<uint8_t>& img, uint64_t ram_top) {
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
  // The setup header runs from 0x1f1 to 0x202 + the byte at 0x201.
  uint64_t hdr_end = 0x202 + uint64_t{get<uint8_t>(img, 0x201)};
  if (!in_file(0x1f1, hdr_end - 0x1f1, img.size())) bad("bzImage setup header truncated");

  uint64_t load = get<uint64_t>(img, 0x258);  // pref_address
  if (load < kHighMemStart) load = kHighMemStart;
  uint32_t init_size = get<uint32_t>(img, 0x260);
  uint64_t span = std::max<uint64_t>(kernel_size, init_size);
  if (load + span < load || load + span > ram_top) bad("bzImage needs " + std::to_string(span) + " bytes at " +
                                                        std::to_string(load) + ": more than guest RAM");
  LoadedKernel k;
  place(mem, img, load, kernel_off, kernel_size, kernel_size, ram_top, &k.end);
  k.end = load + span;
  k.mode = EntryMode::Linux64;
  k.entry = load + 0x200;
  k.is_bzimage = true;
  k.setup_header.assign(img.begin() + 0x1f1, img.begin() + static_cast<long>(hdr_end));
  k.boot_protocol = version;
  k.initrd_addr_max = get<uint32_t>(img, 0x22c);
  k.cmdline_size = get<uint32_t>(img, 0x238);
  return k;
}

}  // namespace

LoadedKernel load_kernel_image(GuestMemory& mem, const std::vector<uint8_t>& img, uint64_t ram_top) {
  if (img.size() >= 4 && std::memcmp(img.data(), ELFMAG, SELFMAG) == 0) {
    if (img.size() < EI_NIDENT) bad("truncated ELF header");
    if (img[EI_DATA] != ELFDATA2LSB) bad("big-endian ELF");
    if (img[EI_CLASS] == ELFCLASS64) return load_elf<Elf64_Ehdr, Elf64_Phdr>(mem, img, ram_top);
    if (img[EI_CLASS] == ELFCLASS32) return load_elf<Elf32_Ehdr, Elf32_Phdr>(mem, img, ram_top);
    bad("unknown ELF class");
  }
  if (img.size() >= 0x206 && get<uint32_t>(img, 0x202) == kHdrSMagic && get<uint16_t>(img, 0x1fe) == 0xaa55)
    return load_bzimage(mem, img, ram_top);
  bad("not an ELF kernel and not a bzImage");
}

std::vector<uint8_t> read_file(const std::string& path, uint64_t max_bytes, const char* what) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw_sys_error(code::kBootFailed, std::string(what) + " " + path);
  struct stat st;
  if (::fstat(fd.get(), &st) < 0) throw_sys_error(code::kBootFailed, std::string(what) + " " + path);
  if (!S_ISREG(st.st_mode)) throw Error(code::kBootFailed, std::string(what) + " " + path + " is not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes)
    throw Error(code::kBootFailed, std::string(what) + " " + path + " is larger than guest RAM allows");
  std::vector<uint8_t> buf(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t n = ::pread(fd.get(), buf.data() + done, buf.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_sys_error(code::kIo, std::string("read ") + what + " " + path);
    if (n == 0) throw Error(code::kBootFailed, std::string(what) + " " + path + " shrank while being read");
    done += static_cast<size_t>(n);
  }
  return buf;
}

}  // namespace torpor::x86
