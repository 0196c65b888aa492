#include "ring.h"

#include <stdlib.h>
#include <string.h>

static void copy_in(struct ring *r, uint64_t off, const uint8_t *p, size_t n) {
  size_t at = (size_t)(off & (r->cap - 1));
  size_t first = r->cap - at < n ? r->cap - at : n;
  memcpy(r->buf + at, p, first);
  memcpy(r->buf, p + first, n - first);
}

void ring_copy(const struct ring *r, uint64_t off, uint8_t *dst, size_t n) {
  size_t at = (size_t)(off & (r->cap - 1));
  size_t first = r->cap - at < n ? r->cap - at : n;
  memcpy(dst, r->buf + at, first);
  memcpy(dst + first, r->buf, n - first);
}

static int grow(struct ring *r, size_t need) {
  size_t cap = r->cap ? r->cap : 4096;
  while (cap < need && cap < RING_MAX) cap *= 2;
  if (cap == r->cap) return 0;
  uint8_t *buf = malloc(cap);
  if (!buf) return -1;
  struct ring bigger = {buf, cap, r->start, r->end};
  size_t kept = (size_t)(r->end - r->start);
  /* Re-place the kept bytes at their offsets modulo the new capacity. */
  for (size_t done = 0; done < kept;) {
    uint8_t tmp[4096];
    size_t n = kept - done < sizeof tmp ? kept - done : sizeof tmp;
    ring_copy(r, r->start + done, tmp, n);
    copy_in(&bigger, r->start + done, tmp, n);
    done += n;
  }
  free(r->buf);
  *r = bigger;
  return 0;
}

int ring_append(struct ring *r, const uint8_t *p, size_t n) {
  if (n == 0) return 0;
  size_t kept = (size_t)(r->end - r->start);
  if (kept + n > r->cap && r->cap < RING_MAX && grow(r, kept + n) != 0) return -1;
  if (n > r->cap) { /* only when n > RING_MAX: keep its tail */
    p += n - r->cap;
    r->start = r->end += n - r->cap;
    n = r->cap;
  }
  copy_in(r, r->end, p, n);
  r->end += n;
  if (r->end - r->start > r->cap) r->start = r->end - r->cap;
  return 0;
}

void ring_free(struct ring *r) {
  free(r->buf);
  memset(r, 0, sizeof *r);
}

void ring_release(struct ring *r) {
  free(r->buf);
  r->buf = NULL;
  r->cap = 0;
  r->start = r->end;
}
