#include "agent_ready.h"

#include "devices.h"
#include "interrupts.h"
#include "io.h"
#include "lib.h"
#include "serial.h"
#include "vsock.h"
#include "wait.h"

#define CALIBRATE_MS 2u

/* TSC ticks per millisecond, measured against one LAPIC one-shot (the APIC bus clock is
 * the only time base with a known rate here). 0 when the timer never fired. */
static uint32_t tsc_per_ms(void) {
  uint32_t before = intr_timer_count;
  uint64_t t0 = rdtsc();
  intr_timer_oneshot(CALIBRATE_MS * LAPIC_TICKS_PER_MS);
  while (intr_timer_count == before && rdtsc() - t0 < (1ull << 36)) {
  }
  if (intr_timer_count == before) return 0;
  uint64_t dt = rdtsc() - t0;
  return dt > 0xffffffffull ? 0 : (uint32_t)dt / CALIBRATE_MS;
}

/* ticks / per_ms with 32-bit divisions only (no libgcc): drop low bits of both until the
 * dividend fits; the error is far below a millisecond. */
static uint32_t ticks_to_ms(uint64_t ticks, uint32_t per_ms) {
  while (ticks > 0xffffffffull && per_ms > 1) {
    ticks >>= 1;
    per_ms >>= 1;
  }
  return ticks > 0xffffffffull ? 0xffffffffu : (uint32_t)ticks / per_ms;
}

void agent_ready_announce(uint64_t tsc_at_entry) {
  if (!devices.vsock) {
    kv_str("agent_ready", "error");
    kv_str("reason", "no-vsock");
    kv_end();
    return;
  }
  uint64_t elapsed = rdtsc() - tsc_at_entry;
  uint32_t per_ms = tsc_per_ms();
  char line[64];
  static const char head[] = "torpor-agent ready v1 ";
  size_t n = sizeof head - 1;
  memcpy(line, head, n);
  n += fmt_u64_dec(line + n, per_ms ? ticks_to_ms(elapsed, per_ms) : 0);
  static const char listen[] = " vsock:";
  memcpy(line + n, listen, sizeof listen - 1);
  n += sizeof listen - 1;
  n += fmt_u64_dec(line + n, VSOCK_AGENT_PORT);
  line[n++] = '\n';
  serial_write(line, n);
  /* As the agent does, after listening: the host waits for this, not for the line above. */
  vsock_knock();
}
