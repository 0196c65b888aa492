#include "interrupts.h"

#include "io.h"
#include "lib.h"
#include "serial.h"

#define LAPIC_BASE 0xfee00000u
#define LAPIC_ID 0x020
#define LAPIC_TPR 0x080
#define LAPIC_EOI 0x0b0
#define LAPIC_SVR 0x0f0
#define LAPIC_LVT_TIMER 0x320
#define LAPIC_TIMER_INIT 0x380
#define LAPIC_TIMER_DIV 0x3e0

#define IOAPIC_BASE 0xfec00000u
#define IOAPIC_REGSEL 0x00
#define IOAPIC_WIN 0x10

struct isr_frame {
  uint32_t edi, esi, ebp, esp_unused, ebx, edx, ecx, eax; /* pusha */
  uint32_t vector, error;
  uint32_t eip, cs, eflags;
};

struct idt_gate {
  uint16_t offset_lo;
  uint16_t selector;
  uint8_t zero;
  uint8_t type_attr;
  uint16_t offset_hi;
} __attribute__((packed));

struct idt_desc {
  uint16_t limit;
  uint32_t base;
} __attribute__((packed));

extern const uint32_t isr_stub_table[256];
static struct idt_gate idt[256];

volatile uint32_t intr_work;
volatile uint32_t intr_gsi_count[MAX_GSI];
volatile uint32_t intr_timer_count;
volatile uint32_t intr_spurious_count;
static gsi_handler gsi_fn[MAX_GSI];
static void *gsi_ctx[MAX_GSI];
static uint32_t ioapic_pins;
static uint32_t lapic_id;

static inline uint32_t lapic_read(uint32_t reg) { return mmio_read32(LAPIC_BASE + reg); }
static inline void lapic_write(uint32_t reg, uint32_t v) { mmio_write32(LAPIC_BASE + reg, v); }

static uint32_t ioapic_read(uint32_t reg) {
  mmio_write32(IOAPIC_BASE + IOAPIC_REGSEL, reg);
  return mmio_read32(IOAPIC_BASE + IOAPIC_WIN);
}
static void ioapic_write(uint32_t reg, uint32_t v) {
  mmio_write32(IOAPIC_BASE + IOAPIC_REGSEL, reg);
  mmio_write32(IOAPIC_BASE + IOAPIC_WIN, v);
}

static void pic_remap_and_mask(void) {
  /* ICW1-4: vectors 0x20/0x28 (away from the exceptions), then mask every line: the
   * IOAPIC delivers the device interrupts. */
  outb(0x20, 0x11);
  outb(0xa0, 0x11);
  outb(0x21, 0x20);
  outb(0xa1, 0x28);
  outb(0x21, 0x04);
  outb(0xa1, 0x02);
  outb(0x21, 0x01);
  outb(0xa1, 0x01);
  outb(0x21, 0xff);
  outb(0xa1, 0xff);
}

void intr_load_idt(void) {
  struct idt_desc d = {sizeof idt - 1, (uint32_t)(uintptr_t)idt};
  __asm__ volatile("lidt %0" : : "m"(d));
}

void intr_init(void) {
  for (int v = 0; v < 256; v++) {
    uint32_t off = isr_stub_table[v];
    idt[v].offset_lo = (uint16_t)off;
    idt[v].selector = 0x08;
    idt[v].zero = 0;
    idt[v].type_attr = 0x8e; /* present, DPL 0, 32-bit interrupt gate */
    idt[v].offset_hi = (uint16_t)(off >> 16);
  }
  intr_load_idt();
  pic_remap_and_mask();

  lapic_write(LAPIC_TPR, 0);
  lapic_write(LAPIC_SVR, 0x100 | VEC_SPURIOUS);
  lapic_write(LAPIC_LVT_TIMER, 0x10000 | VEC_TIMER); /* masked until armed */
  lapic_id = lapic_read(LAPIC_ID) >> 24;

  uint32_t ver = ioapic_read(0x01);
  ioapic_pins = ((ver >> 16) & 0xff) + 1;
  if (ioapic_pins > MAX_GSI) ioapic_pins = MAX_GSI;
  for (uint32_t pin = 0; pin < ioapic_pins; pin++) {
#ifdef TESTVM_DEBUG_ALLPINS
    ioapic_write(0x10 + 2 * pin, (pin == 0 || pin == 2 ? 0x10000 : 0) | (VEC_GSI_BASE + pin));
#else
    ioapic_write(0x10 + 2 * pin, 0x10000 | (VEC_GSI_BASE + pin)); /* masked */
#endif
    ioapic_write(0x11 + 2 * pin, lapic_id << 24);
  }
}

int intr_route_gsi(uint32_t gsi, gsi_handler fn, void *ctx) {
  if (gsi >= ioapic_pins) return 0;
  gsi_fn[gsi] = fn;
  gsi_ctx[gsi] = ctx;
  /* fixed delivery, physical destination, active high, edge, unmasked */
  ioapic_write(0x11 + 2 * gsi, lapic_id << 24);
  ioapic_write(0x10 + 2 * gsi, VEC_GSI_BASE + gsi);
  return 1;
}

uint32_t intr_ioapic_pins(void) { return ioapic_pins; }
uint32_t intr_lapic_id(void) { return lapic_id; }

void intr_timer_oneshot(uint32_t count) {
  lapic_write(LAPIC_TIMER_DIV, 0x0b); /* divide by 1 */
  lapic_write(LAPIC_LVT_TIMER, VEC_TIMER); /* one-shot, unmasked */
  lapic_write(LAPIC_TIMER_INIT, count);
}

void intr_wait(void) { cpu_sti_hlt(); }

static const char *const exception_names[32] = {
    "DE", "DB", "NMI", "BP", "OF", "BR", "UD", "NM", "DF", "MF_OLD", "TS", "NP", "SS", "GP", "PF", "RES15",
    "MF", "AC", "MC", "XM", "VE", "CP", "RES22", "RES23", "RES24", "RES25", "RES26", "RES27", "HV", "VC", "SX", "RES31"};

void isr_dispatch(struct isr_frame *f);
void isr_dispatch(struct isr_frame *f) {
  uint32_t v = f->vector;
  if (v < 32) {
    /* A fault in the test guest is a finding: say where, then stop for good. */
    kv_str("exception", exception_names[v]);
    kv_u64("vector", v);
    kv_hex("eip", f->eip);
    kv_hex("error", f->error);
    kv_end();
    cpu_halt_forever();
  }
  if (v >= VEC_GSI_BASE && v < VEC_GSI_BASE + MAX_GSI) {
    uint32_t gsi = v - VEC_GSI_BASE;
    intr_gsi_count[gsi]++;
    if (gsi_fn[gsi]) gsi_fn[gsi](gsi_ctx[gsi]);
    intr_work = 1;
    lapic_write(LAPIC_EOI, 0);
    return;
  }
  if (v == VEC_TIMER) {
    intr_timer_count++;
    intr_work = 1;
    lapic_write(LAPIC_EOI, 0);
    return;
  }
  /* 0xff (LAPIC spurious: no EOI) or a PIC spurious vector (the PIC is masked). */
  intr_spurious_count++;
}
