/* What the drivers need from the rest of the guest, for the host-side tests:
 * no interrupts (everything polled), waits that let the fake device run, and result
 * lines printed to stdout. */
#include <stdarg.h>
#include <stdio.h>

#include "config.h"
#include "interrupts.h"
#include "serial.h"
#include "status.h"
#include "wait.h"

struct config config = {.event_idx = 1};
volatile uint32_t wait_rescued;
volatile struct status_page status_page = {.magic = STATUS_MAGIC};

int intr_route_gsi(uint32_t gsi, gsi_handler fn, void *ctx) {
  (void)gsi, (void)fn, (void)ctx;
  return 0;
}

/* The test's device runs between the driver's checks. */
void test_device_step(void);

int wait_until(int (*cond)(void *), void *ctx, uint32_t timeout_ms, int sleep) {
  (void)timeout_ms, (void)sleep;
  for (int i = 0; i < 1000; i++) {
    if (cond(ctx)) return 1;
    test_device_step();
  }
  return cond(ctx);
}

static char line[4096];
static size_t line_len;
const char *last_result_line(void);
const char *last_result_line(void) { return line; }

static void add(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (line_len < sizeof line) line_len += (size_t)vsnprintf(line + line_len, sizeof line - line_len, fmt, ap);
  va_end(ap);
}
void kv_str(const char *key, const char *value) { add("%s%s=%s", line_len ? " " : "", key, value); }
void kv_strn(const char *key, const char *value, size_t n) { add("%s%s=%.*s", line_len ? " " : "", key, (int)n, value); }
void kv_u64(const char *key, uint64_t v) { add("%s%s=%llu", line_len ? " " : "", key, (unsigned long long)v); }
void kv_hex(const char *key, uint32_t v) { add("%s%s=0x%x", line_len ? " " : "", key, v); }
void kv_hexbytes(const char *key, const uint8_t *p, size_t n) {
  add("%s%s=", line_len ? " " : "", key);
  for (size_t i = 0; i < n; i++) add("%02x", p[i]);
}
void kv_end(void) {
  printf("  guest: %s\n", line);
  line_len = 0;
}
