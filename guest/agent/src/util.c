#include "util.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t clock_ms(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

uint64_t now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }
uint64_t boot_ms(void) { return clock_ms(CLOCK_BOOTTIME); }

int64_t wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

size_t bytebuf_pending(const struct bytebuf *b) { return b->len - b->off; }

uint8_t *bytebuf_reserve(struct bytebuf *b, size_t n) {
  if (b->off > 0 && (b->off == b->len || b->cap - b->len < n)) {
    memmove(b->p, b->p + b->off, b->len - b->off);
    b->len -= b->off;
    b->off = 0;
  }
  if (b->cap - b->len < n) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap - b->len < n) cap *= 2;
    uint8_t *p = realloc(b->p, cap);
    if (!p) return NULL;
    b->p = p;
    b->cap = cap;
  }
  return b->p + b->len;
}

void bytebuf_consume(struct bytebuf *b, size_t n) {
  b->off += n;
  if (b->off == b->len) {
    b->off = b->len = 0;
    /* Give back a large buffer once it drained (a 50 MiB file went through it). */
    if (b->cap > (4u << 20)) {
      free(b->p);
      b->p = NULL;
      b->cap = 0;
    }
  }
}

void bytebuf_free(struct bytebuf *b) {
  free(b->p);
  b->p = NULL;
  b->off = b->len = b->cap = 0;
}

char *strndup_checked(const uint8_t *p, size_t n) {
  if (memchr(p, 0, n)) return NULL;
  char *s = malloc(n + 1);
  if (!s) return NULL;
  memcpy(s, p, n);
  s[n] = 0;
  return s;
}
