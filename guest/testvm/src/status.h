/* The status page: fixed guest-physical address 0x100000 (first page of the image),
 * so the host reads it with its memory accessor, no symbols needed. Layout is stable
 * and documented in README.md. */
#ifndef TESTVM_STATUS_H
#define TESTVM_STATUS_H

#include <stdint.h>

#define STATUS_MAGIC 0x314d5654u /* "TVM1" little-endian */

enum boot_stage { STAGE_LOADED = 0, STAGE_ENTERED = 1, STAGE_READY = 2, STAGE_HALTED = 3 };

struct status_page {
  uint32_t magic;     /* 0x00: STATUS_MAGIC, in the image as loaded */
  uint32_t stage;     /* 0x04: enum boot_stage */
  uint64_t counter;   /* 0x08: advanced by the counting loop */
  uint32_t counting;  /* 0x10: 1 while the counting loop runs */
  uint32_t commands;  /* 0x14: commands executed */
  uint32_t last_mem_tag;   /* 0x18: tag of the last `mem` write */
  uint32_t last_mem_pages; /* 0x1c: pages of the last `mem` write */
  uint32_t last_mem_base;  /* 0x20: base of the last `mem` write */
  uint32_t resumed;        /* 0x24: RESUMED requests served (agent protocol) */
  uint64_t resumed_time_ns;   /* 0x28: time_ns of the last RESUMED (host wall clock) */
  uint32_t syncs;             /* 0x30: SYNC requests served */
  uint32_t resumed_entropy_len; /* 0x34: entropy bytes of the last RESUMED */
  uint64_t resumed_entropy_head; /* 0x38: its first 8 bytes (little-endian, zero-padded) */
  uint32_t aps_alive;      /* 0x40: application processors that reached ap_main */
  uint32_t aps_stop;       /* 0x44: set by `smp stop`: APs halt */
  uint64_t cpu_counter[8]; /* 0x48: per APIC id (< 8), advanced by each AP's loop */
};

extern volatile struct status_page status_page;

_Static_assert(__builtin_offsetof(struct status_page, resumed_time_ns) == 0x28, "status page layout");
_Static_assert(__builtin_offsetof(struct status_page, resumed_entropy_head) == 0x38, "status page layout");
_Static_assert(__builtin_offsetof(struct status_page, aps_alive) == 0x40, "status page layout");

#endif
