/* Bounded waiting: the LAPIC one-shot timer is the watchdog, so a device that never
 * answers gives a `timeout` result line instead of a silent hang. */
#ifndef TESTVM_WAIT_H
#define TESTVM_WAIT_H

#include <stdint.h>

/* Returns 1 once cond(ctx) holds, 0 after timeout_ms. With `sleep` the CPU halts
 * between interrupts; without it the condition is polled. */
int wait_until(int (*cond)(void *), void *ctx, uint32_t timeout_ms, int sleep);

/* Completions found by the watchdog without any device interrupt (lost interrupts). */
extern volatile uint32_t wait_rescued;

/* LAPIC timer ticks per millisecond (KVM and QEMU run the APIC bus at 1 GHz). */
#define LAPIC_TICKS_PER_MS 1000000u

#endif
