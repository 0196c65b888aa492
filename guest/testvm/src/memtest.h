/* Tagged words across many pages: one 32-bit word at the start of each 4 KiB page,
 * value = tag XOR address. Sparse on purpose: under KVM's instruction emulator each
 * store costs microseconds, and one word dirties the whole page anyway. */
#ifndef TESTVM_MEMTEST_H
#define TESTVM_MEMTEST_H

#include <stdint.h>

#define MEM_DEFAULT_BASE 0x01000000u /* 16 MiB */
#define MEM_DEFAULT_PAGES 4096u      /* 16 MiB of pages */

struct mem_result {
  uint32_t bad;       /* words that did not match */
  uint32_t first_bad; /* address of the first, when bad > 0 */
  uint32_t seen;      /* the value found there */
};

static inline uint32_t mem_pattern(uint32_t tag, uint32_t addr) { return tag ^ addr; }

void mem_write(uint32_t base, uint32_t pages, uint32_t tag);
void mem_verify(uint32_t base, uint32_t pages, uint32_t tag, struct mem_result *r);

#endif
