#include "boot_info.h"

#include "lib.h"

struct boot_info boot_info;

/* Everything the VMM hands over is only read below 4 GiB (paging is off) and is
 * copied with bounds, so a bad start info gives a short command line, not a fault. */
void boot_info_read(const struct hvm_start_info *si) {
  boot_info.valid = 0;
  boot_info.cmdline[0] = '\0';
  boot_info.memmap_count = 0;
  boot_info.ram_bytes = 0;
  if ((uintptr_t)si == 0 || si->magic != HVM_START_MAGIC) return;
  boot_info.valid = 1;
  boot_info.version = si->version;
  if (si->cmdline_paddr && si->cmdline_paddr < 0xffffffffull) {
    const char *src = (const char *)(uintptr_t)si->cmdline_paddr;
    size_t n = 0;
    while (n < MAX_CMDLINE - 1 && src[n]) {
      boot_info.cmdline[n] = src[n];
      n++;
    }
    boot_info.cmdline[n] = '\0';
  }
  if (si->version >= 1 && si->memmap_paddr && si->memmap_paddr < 0xffffffffull) {
    const struct hvm_memmap_entry *e = (const struct hvm_memmap_entry *)(uintptr_t)si->memmap_paddr;
    uint32_t n = si->memmap_entries < MAX_MEMMAP ? si->memmap_entries : MAX_MEMMAP;
    for (uint32_t i = 0; i < n; i++) {
      boot_info.memmap[i] = e[i];
      if (e[i].type == E820_RAM) boot_info.ram_bytes += e[i].size;
    }
    boot_info.memmap_count = n;
  }
}

int boot_ram_contains(uint64_t addr, uint64_t len) {
  if (addr + len < addr) return 0;
  for (uint32_t i = 0; i < boot_info.memmap_count; i++) {
    const struct hvm_memmap_entry *e = &boot_info.memmap[i];
    if (e->type == E820_RAM && addr >= e->addr && addr + len <= e->addr + e->size) return 1;
  }
  return 0;
}
