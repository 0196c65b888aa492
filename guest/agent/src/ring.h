/* The kept tail of one output stream of a process, addressed by absolute byte offset
 * since the process started. Grows on demand up to RING_MAX (1 MiB), then drops the
 * oldest bytes. */
#ifndef AGENT_RING_H
#define AGENT_RING_H

#include <stddef.h>
#include <stdint.h>

#define RING_MAX (1u << 20)

struct ring {
  uint8_t *buf;
  size_t cap;     /* power of two <= RING_MAX */
  uint64_t start; /* offset of the oldest byte kept */
  uint64_t end;   /* offset one past the newest byte */
};

/* Appends n bytes (n <= RING_MAX); -1 when out of memory (nothing appended). */
int ring_append(struct ring *r, const uint8_t *p, size_t n);
/* Copies n bytes starting at offset off (start <= off, off + n <= end). */
void ring_copy(const struct ring *r, uint64_t off, uint8_t *dst, size_t n);
void ring_free(struct ring *r);
/* Drops every kept byte and the buffer, keeping the offsets (start = end). */
void ring_release(struct ring *r);

#endif
