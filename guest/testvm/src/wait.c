#include "wait.h"

#include "interrupts.h"
#include "io.h"

volatile uint32_t wait_rescued;

/* The watchdog runs in short slices: a completion whose interrupt never came is
 * still seen (a slice later) and counted in wait_rescued, so a VMM that loses
 * interrupts shows up in the `irq` report instead of hanging a test. */
#define SLICE_MS 10u

static uint32_t device_interrupts(void) {
  uint32_t n = 0;
  for (int i = 0; i < MAX_GSI; i++) n += intr_gsi_count[i];
  return n;
}

int wait_until(int (*cond)(void *), void *ctx, uint32_t timeout_ms, int sleep) {
  uint32_t slices = (timeout_ms + SLICE_MS - 1) / SLICE_MS;
  if (slices == 0) slices = 1;
  for (uint32_t s = 0; s < slices; s++) {
    uint32_t fired = intr_timer_count;
    uint32_t dev = device_interrupts();
    intr_timer_oneshot(SLICE_MS * LAPIC_TICKS_PER_MS);
    for (;;) {
      cpu_cli();
      if (cond(ctx)) {
        cpu_sti();
        intr_timer_oneshot(0); /* a zero initial count stops the timer */
        if (sleep && (s > 0 || intr_timer_count != fired) && device_interrupts() == dev) wait_rescued++;
        return 1;
      }
      if (intr_timer_count != fired) {
        cpu_sti();
        break;
      }
      if (sleep)
        cpu_sti_hlt();
      else
        cpu_sti();
    }
  }
  return cond(ctx);
}
