/* The few string and number helpers the guest needs (no libc). */
#ifndef TESTVM_LIB_H
#define TESTVM_LIB_H

#include <stddef.h>
#include <stdint.h>

/* gcc may emit calls to these for struct copies and zeroing. */
void *memset(void *dst, int c, size_t n);
void *memcpy(void *dst, const void *src, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);

int str_eq(const char *a, const char *b);
int str_starts(const char *s, const char *prefix);

/* Parses a decimal or 0x-hex number with an optional K/M/G suffix (when allow_suffix).
 * Returns the number of characters consumed, 0 when there is no number. */
size_t parse_u64(const char *s, uint64_t *out, int allow_suffix);
/* Whole-token variant: 1 when the entire string is a number. */
int parse_u32_token(const char *s, uint32_t *out);

/* Formats into buf (no terminator); returns the length. */
size_t fmt_u64_dec(char *buf, uint64_t v);
size_t fmt_hex32(char *buf, uint32_t v); /* 0x-prefixed, minimal digits */

#endif
