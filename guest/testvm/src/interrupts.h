/* IDT, the legacy PIC (remapped and masked), the local APIC (one-shot timer) and the
 * IOAPIC (device GSIs). Vectors: 0-31 exceptions (fatal: reported, then halt),
 * 0x20-0x2f the masked PIC (spurious only), 0x30 LAPIC timer, 0x40 + gsi for IOAPIC
 * pins, 0xff LAPIC spurious. */
#ifndef TESTVM_INTERRUPTS_H
#define TESTVM_INTERRUPTS_H

#include <stdint.h>

#define VEC_TIMER 0x30
#define VEC_GSI_BASE 0x40
#define VEC_SPURIOUS 0xff
#define MAX_GSI 24

typedef void (*gsi_handler)(void *ctx);

void intr_init(void);
/* Loads the (shared) IDT on this CPU: application processors call it too, so a fault
 * on any CPU is reported. */
void intr_load_idt(void);
/* Routes an IOAPIC pin (edge, active high) to VEC_GSI_BASE + gsi on this CPU.
 * Returns 0 when the pin does not exist (the caller then polls). */
int intr_route_gsi(uint32_t gsi, gsi_handler fn, void *ctx);

/* Set by every handler that may have made work for the main loop. */
extern volatile uint32_t intr_work;

/* Counts, for the `irq` command. */
extern volatile uint32_t intr_gsi_count[MAX_GSI];
extern volatile uint32_t intr_timer_count;
extern volatile uint32_t intr_spurious_count;
uint32_t intr_ioapic_pins(void);
uint32_t intr_lapic_id(void);

/* Arms the LAPIC timer once: `count` ticks of the APIC bus clock divided by 1. */
void intr_timer_oneshot(uint32_t count);

/* Sleeps (sti; hlt) until an interrupt arrives, then returns with interrupts on. */
void intr_wait(void);

#endif
