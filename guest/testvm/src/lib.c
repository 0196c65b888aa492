#include "lib.h"

void *memset(void *dst, int c, size_t n) {
  uint8_t *d = dst;
  while (n--) *d++ = (uint8_t)c;
  return dst;
}

void *memcpy(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  while (n--) *d++ = *s++;
  return dst;
}

int memcmp(const void *a, const void *b, size_t n) {
  const uint8_t *x = a, *y = b;
  for (; n; n--, x++, y++)
    if (*x != *y) return *x < *y ? -1 : 1;
  return 0;
}

size_t strlen(const char *s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}

int str_eq(const char *a, const char *b) {
  while (*a && *a == *b) a++, b++;
  return *a == *b;
}

int str_starts(const char *s, const char *prefix) {
  while (*prefix)
    if (*s++ != *prefix++) return 0;
  return 1;
}

static int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

size_t parse_u64(const char *s, uint64_t *out, int allow_suffix) {
  const char *p = s;
  uint64_t v = 0;
  if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X') && hex_digit(p[2]) >= 0) {
    p += 2;
    for (int d; (d = hex_digit(*p)) >= 0; p++) v = (v << 4) | (uint64_t)d;
  } else {
    if (*p < '0' || *p > '9') return 0;
    /* v * 10 as shifts: no 64-bit multiply helper in a libgcc-free build */
    for (; *p >= '0' && *p <= '9'; p++) v = (v << 3) + (v << 1) + (uint64_t)(*p - '0');
  }
  if (allow_suffix) {
    if (*p == 'K' || *p == 'k') v <<= 10, p++;
    else if (*p == 'M' || *p == 'm') v <<= 20, p++;
    else if (*p == 'G' || *p == 'g') v <<= 30, p++;
  }
  *out = v;
  return (size_t)(p - s);
}

int parse_u32_token(const char *s, uint32_t *out) {
  uint64_t v;
  size_t n = parse_u64(s, &v, 0);
  if (n == 0 || s[n] != '\0' || v > 0xffffffffull) return 0;
  *out = (uint32_t)v;
  return 1;
}

/* Divides by 10 with 32-bit operations only (no __udivdi3 without libgcc). */
static uint32_t divmod10(uint64_t *v) {
  uint32_t hi = (uint32_t)(*v >> 32), lo = (uint32_t)*v;
  uint32_t qhi = hi / 10, r = hi % 10;
  uint32_t qlo = 0;
  /* long division of (r:lo) by 10, 16 bits at a time so nothing overflows 32 bits */
  uint32_t part = (r << 16) | (lo >> 16);
  qlo = (part / 10) << 16;
  r = part % 10;
  part = (r << 16) | (lo & 0xffff);
  qlo |= part / 10;
  r = part % 10;
  *v = ((uint64_t)qhi << 32) | qlo;
  return r;
}

size_t fmt_u64_dec(char *buf, uint64_t v) {
  char tmp[20];
  size_t n = 0;
  do tmp[n++] = (char)('0' + divmod10(&v));
  while (v);
  for (size_t i = 0; i < n; i++) buf[i] = tmp[n - 1 - i];
  return n;
}

size_t fmt_hex32(char *buf, uint32_t v) {
  static const char digits[] = "0123456789abcdef";
  size_t n = 0;
  buf[n++] = '0';
  buf[n++] = 'x';
  int shift = 28;
  while (shift > 0 && ((v >> shift) & 0xf) == 0) shift -= 4;
  for (; shift >= 0; shift -= 4) buf[n++] = digits[(v >> shift) & 0xf];
  return n;
}
