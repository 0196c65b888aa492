/* What the VMM tells the guest at the PVH entry: hvm_start_info (version >= 1). */
#ifndef TESTVM_BOOT_INFO_H
#define TESTVM_BOOT_INFO_H

#include <stdint.h>

#define HVM_START_MAGIC 0x336ec578u
#define E820_RAM 1u

struct hvm_start_info {
  uint32_t magic;
  uint32_t version;
  uint32_t flags;
  uint32_t nr_modules;
  uint64_t modlist_paddr;
  uint64_t cmdline_paddr;
  uint64_t rsdp_paddr;
  uint64_t memmap_paddr; /* version >= 1 */
  uint32_t memmap_entries;
  uint32_t reserved;
};

struct hvm_memmap_entry {
  uint64_t addr;
  uint64_t size;
  uint32_t type;
  uint32_t reserved;
};

#define MAX_CMDLINE 2048
#define MAX_MEMMAP 32

struct boot_info {
  int valid;             /* magic matched */
  uint32_t version;
  char cmdline[MAX_CMDLINE]; /* copied: the VMM's copy lies in RAM we may reuse */
  uint32_t memmap_count;
  struct hvm_memmap_entry memmap[MAX_MEMMAP];
  uint64_t ram_bytes;    /* sum of RAM entries */
};

extern struct boot_info boot_info;

void boot_info_read(const struct hvm_start_info *si);
/* 1 when [addr, addr + len) lies inside one RAM entry of the memory map. */
int boot_ram_contains(uint64_t addr, uint64_t len);

#endif
