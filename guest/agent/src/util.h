/* Small shared helpers: clocks, a growable byte buffer, string duplication with a bound. */
#ifndef AGENT_UTIL_H
#define AGENT_UTIL_H

#include <stddef.h>
#include <stdint.h>

uint64_t now_ms(void);         /* CLOCK_MONOTONIC */
uint64_t boot_ms(void);        /* CLOCK_BOOTTIME: the readiness line's "ms since boot" */
int64_t wall_ns(void);         /* CLOCK_REALTIME */

/* Bytes p[off..len) are pending; the buffer grows on demand and is compacted in place. */
struct bytebuf {
  uint8_t *p;
  size_t off, len, cap;
};

size_t bytebuf_pending(const struct bytebuf *b);
/* Makes room for n more bytes at p + len; returns that pointer or NULL (no memory). */
uint8_t *bytebuf_reserve(struct bytebuf *b, size_t n);
void bytebuf_consume(struct bytebuf *b, size_t n);
void bytebuf_free(struct bytebuf *b);

/* A NUL-terminated copy of n bytes, or NULL when they hold a NUL (not a valid C string)
 * or memory runs out. */
char *strndup_checked(const uint8_t *p, size_t n);

#endif
