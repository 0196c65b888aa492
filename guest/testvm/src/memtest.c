#include "memtest.h"

void mem_write(uint32_t base, uint32_t pages, uint32_t tag) {
  for (uint32_t i = 0; i < pages; i++) {
    uint32_t addr = base + i * 4096u;
    *(volatile uint32_t *)(uintptr_t)addr = mem_pattern(tag, addr);
  }
}

void mem_verify(uint32_t base, uint32_t pages, uint32_t tag, struct mem_result *r) {
  r->bad = 0;
  r->first_bad = 0;
  r->seen = 0;
  for (uint32_t i = 0; i < pages; i++) {
    uint32_t addr = base + i * 4096u;
    uint32_t v = *(volatile uint32_t *)(uintptr_t)addr;
    if (v != mem_pattern(tag, addr)) {
      if (r->bad == 0) {
        r->first_bad = addr;
        r->seen = v;
      }
      r->bad++;
    }
  }
}
