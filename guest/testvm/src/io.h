/* Port I/O, MMIO and barriers. Every device register access of the guest goes through
 * these, so each one is a single plain instruction the KVM emulator handles. */
#ifndef TESTVM_IO_H
#define TESTVM_IO_H

#include <stdint.h>

static inline void outb(uint16_t port, uint8_t v) { __asm__ volatile("outb %0, %1" : : "a"(v), "Nd"(port)); }
static inline uint8_t inb(uint16_t port) {
  uint8_t v;
  __asm__ volatile("inb %1, %0" : "=a"(v) : "Nd"(port));
  return v;
}

#ifdef TESTVM_HOST_TEST
/* The drivers' host-side tests (test/) run this code against a fake device. */
uint32_t host_mmio_read32(uintptr_t addr);
void host_mmio_write32(uintptr_t addr, uint32_t v);
static inline uint32_t mmio_read32(uintptr_t addr) { return host_mmio_read32(addr); }
static inline void mmio_write32(uintptr_t addr, uint32_t v) { host_mmio_write32(addr, v); }
static inline void mb(void) { __sync_synchronize(); }
#else
static inline uint32_t mmio_read32(uintptr_t addr) { return *(volatile uint32_t *)addr; }
static inline void mmio_write32(uintptr_t addr, uint32_t v) { *(volatile uint32_t *)addr = v; }

/* Orders the ring writes before the index write (and the index read before the ring
 * reads). A locked add is a full fence without SSE2's mfence. */
static inline void mb(void) { __asm__ volatile("lock; addl $0, (%%esp)" ::: "memory"); }
#endif
static inline void compiler_barrier(void) { __asm__ volatile("" ::: "memory"); }

static inline void cpu_cli(void) { __asm__ volatile("cli" ::: "memory"); }
static inline void cpu_sti(void) { __asm__ volatile("sti" ::: "memory"); }
/* `sti` delays interrupts by one instruction, so an interrupt cannot slip in between
 * the caller's last check and the `hlt`. */
static inline void cpu_sti_hlt(void) { __asm__ volatile("sti; hlt" ::: "memory"); }
static inline void cpu_halt_forever(void) {
  for (;;) __asm__ volatile("cli; hlt" ::: "memory");
}
static inline uint32_t irq_save(void) {
  uint32_t flags;
  __asm__ volatile("pushf; pop %0; cli" : "=r"(flags) : : "memory");
  return flags;
}
static inline void irq_restore(uint32_t flags) {
  if (flags & 0x200) cpu_sti();
}
static inline uint64_t rdtsc(void) {
  uint32_t lo, hi;
  __asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
  return ((uint64_t)hi << 32) | lo;
}

#endif
