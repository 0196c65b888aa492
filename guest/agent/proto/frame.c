/* Frame codec; see frame.h. No libc: the test guest links this file as is. */
#include "frame.h"

uint16_t tp_get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

uint32_t tp_get32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

uint64_t tp_get64(const uint8_t *p) { return (uint64_t)tp_get32(p) | ((uint64_t)tp_get32(p + 4) << 32); }

void tp_put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}

void tp_put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

void tp_put64(uint8_t *p, uint64_t v) {
  tp_put32(p, (uint32_t)v);
  tp_put32(p + 4, (uint32_t)(v >> 32));
}

/* GCC turns a byte loop into a memcpy call, which a freestanding guest does not have. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-loop-distribute-patterns")))
#endif
void tp_copy(uint8_t *dst, const uint8_t *src, size_t n) {
  for (size_t i = 0; i < n; i++) dst[i] = src[i];
}

size_t tp_strlen(const char *s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}

int tp_header_decode(const uint8_t *buf, size_t avail, struct tp_header *out) {
  if (avail < TP_FRAME_HEADER_SIZE) return TP_NEED_MORE;
  out->length = tp_get32(buf);
  out->stream = tp_get32(buf + 4);
  out->type = tp_get16(buf + 8);
  out->flags = tp_get16(buf + 10);
  if (out->length > (out->type == TP_EXEC ? TP_MAX_EXEC_PAYLOAD : TP_MAX_PAYLOAD)) return TP_E_TOO_LARGE;
  if (out->flags & ~TP_FLAGS_KNOWN) return TP_E_BAD_FLAGS;
  return TP_OK_;
}

void tp_header_encode(uint8_t out[TP_FRAME_HEADER_SIZE], const struct tp_header *h) {
  tp_put32(out, h->length);
  tp_put32(out + 4, h->stream);
  tp_put16(out + 8, h->type);
  tp_put16(out + 10, h->flags);
}

/* ---- field bounds ---- */

/* Size rule of a known tag: exact > 0 means a fixed-size value; otherwise max bounds a
 * variable one. */
struct tag_rule {
  uint32_t exact;
  uint32_t max;
};

static struct tag_rule rule_of(uint16_t tag) {
  struct tag_rule r = {0, 0xffffffffu};
  switch (tag) {
    case TP_T_VERSION: case TP_T_CREDIT: case TP_T_UID: case TP_T_GID: case TP_T_TIMEOUT_MS:
    case TP_T_PTY_ROWS: case TP_T_PTY_COLS: case TP_T_PID: case TP_T_SIGNAL: case TP_T_EXIT_CODE:
    case TP_T_MODE: case TP_T_DEPTH: case TP_T_UID_OUT: case TP_T_GID_OUT: case TP_T_WATCH_ID:
      r.exact = 4;
      break;
    case TP_T_FEATURES: case TP_T_REQUEST_ID: case TP_T_OFFSET: case TP_T_OFFSET2: case TP_T_SIZE:
    case TP_T_MTIME_NS: case TP_T_TIME_NS: case TP_T_STDOUT_START: case TP_T_STDERR_START: case TP_T_SEQ:
    case TP_T_DROPPED: case TP_T_FS_SIZE:
      r.exact = 8;
      break;
    case TP_T_RECURSIVE: case TP_T_RUNNING: case TP_T_REBOOT: case TP_T_STDIN: case TP_T_TIMED_OUT:
    case TP_T_PENDING: case TP_T_FOLLOW:
      r.exact = 1;
      break;
    case TP_T_NAME: case TP_T_CODE: case TP_T_ERRNO: case TP_T_MESSAGE: case TP_T_USER: case TP_T_TYPE:
    case TP_T_OWNER: case TP_T_GROUP: case TP_T_EVENT:
      r.max = TP_MAX_STR;
      break;
    case TP_T_HOSTNAME:
      r.max = 63;
      break;
    case TP_T_MACHINE_ID:
      r.exact = 32;
      break;
    case TP_T_MAC:
      r.exact = 6;
      break;
    case TP_T_ARG: case TP_T_SHELL: case TP_T_ENV:
      r.max = TP_MAX_ARG;
      break;
    case TP_T_PATH: case TP_T_PATH2: case TP_T_TARGET:
      r.max = TP_MAX_PATH;
      break;
    case TP_T_NONCE:
      r.max = TP_MAX_NONCE;
      break;
    case TP_T_TAG:
      r.max = TP_MAX_TAG_LABEL;
      break;
    case TP_T_DATA:
      r.max = TP_MAX_DATA;
      break;
    case TP_T_ENTROPY:
      r.max = TP_MAX_ENTROPY;
      break;
    case TP_T_ENTRY:
      r.max = TP_MAX_PAYLOAD;
      break;
    default:
      break; /* unknown: skipped by the reader's user, only bounded by the payload */
  }
  return r;
}

int tp_field_check(const struct tp_field *f) {
  struct tag_rule r = rule_of(f->tag);
  if (r.exact && f->len != r.exact) return TP_E_BAD_FIELD;
  if (f->len > r.max) return TP_E_BAD_FIELD;
  if (r.exact == 1 && f->value[0] > 1) return TP_E_BAD_FIELD; /* bool: 0 or 1 */
  return TP_OK_;
}

void tp_reader_init(struct tp_reader *r, const uint8_t *payload, size_t len) {
  r->p = payload;
  r->len = len;
  r->pos = 0;
}

int tp_reader_next(struct tp_reader *r, struct tp_field *f) {
  if (r->pos > r->len) return TP_E_TRUNCATED;
  size_t left = r->len - r->pos;
  if (left == 0) return TP_END;
  if (left < TP_FIELD_HEADER_SIZE) return TP_E_TRUNCATED;
  const uint8_t *h = r->p + r->pos;
  uint16_t tag = tp_get16(h);
  uint32_t len = tp_get32(h + 2);
  if ((size_t)len > left - TP_FIELD_HEADER_SIZE) return TP_E_TRUNCATED;
  f->tag = tag;
  f->len = len;
  f->value = h + TP_FIELD_HEADER_SIZE;
  int rc = tp_field_check(f);
  if (rc != TP_OK_) return rc;
  r->pos += TP_FIELD_HEADER_SIZE + (size_t)len;
  return TP_OK_;
}

int tp_payload_validate(const uint8_t *payload, size_t len) {
  struct tp_reader r;
  struct tp_field f;
  tp_reader_init(&r, payload, len);
  for (;;) {
    int rc = tp_reader_next(&r, &f);
    if (rc == TP_END) return TP_OK_;
    if (rc != TP_OK_) return rc;
  }
}

int tp_field_u32(const struct tp_field *f, uint32_t *out) {
  if (f->len != 4) return TP_E_BAD_FIELD;
  *out = tp_get32(f->value);
  return TP_OK_;
}

int tp_field_u64(const struct tp_field *f, uint64_t *out) {
  if (f->len != 8) return TP_E_BAD_FIELD;
  *out = tp_get64(f->value);
  return TP_OK_;
}

int tp_field_i32(const struct tp_field *f, int32_t *out) {
  uint32_t v;
  if (tp_field_u32(f, &v) != TP_OK_) return TP_E_BAD_FIELD;
  *out = (int32_t)v;
  return TP_OK_;
}

int tp_field_i64(const struct tp_field *f, int64_t *out) {
  uint64_t v;
  if (tp_field_u64(f, &v) != TP_OK_) return TP_E_BAD_FIELD;
  *out = (int64_t)v;
  return TP_OK_;
}

int tp_field_bool(const struct tp_field *f, int *out) {
  if (f->len != 1 || f->value[0] > 1) return TP_E_BAD_FIELD;
  *out = f->value[0];
  return TP_OK_;
}

/* ---- writer ---- */

void tp_writer_init(struct tp_writer *w, uint8_t *buf, size_t cap) {
  w->buf = buf;
  w->cap = cap;
  w->len = 0;
  w->frame_start = 0;
  w->overflow = 0;
}

/* Reserves n bytes; NULL (and a sticky overflow) when they do not fit. */
static uint8_t *reserve(struct tp_writer *w, size_t n) {
  if (w->overflow || n > w->cap - w->len) {
    w->overflow = 1;
    return 0;
  }
  uint8_t *p = w->buf + w->len;
  w->len += n;
  return p;
}

void tp_writer_frame(struct tp_writer *w, uint32_t stream, uint16_t type, uint16_t flags) {
  w->frame_start = w->len;
  uint8_t *p = reserve(w, TP_FRAME_HEADER_SIZE);
  if (!p) return;
  struct tp_header h = {0, stream, type, flags};
  tp_header_encode(p, &h);
}

size_t tp_writer_finish(struct tp_writer *w) {
  if (w->overflow) return 0;
  size_t total = w->len - w->frame_start;
  size_t payload = total - TP_FRAME_HEADER_SIZE;
  if (payload > TP_MAX_PAYLOAD) {
    w->overflow = 1;
    return 0;
  }
  tp_put32(w->buf + w->frame_start, (uint32_t)payload);
  return total;
}

static uint8_t *field(struct tp_writer *w, uint16_t tag, size_t n) {
  if (n > 0xffffffffu) {
    w->overflow = 1;
    return 0;
  }
  uint8_t *p = reserve(w, TP_FIELD_HEADER_SIZE + n);
  if (!p) return 0;
  tp_put16(p, tag);
  tp_put32(p + 2, (uint32_t)n);
  return p + TP_FIELD_HEADER_SIZE;
}

void tp_put_u32(struct tp_writer *w, uint16_t tag, uint32_t v) {
  uint8_t *p = field(w, tag, 4);
  if (p) tp_put32(p, v);
}

void tp_put_u64(struct tp_writer *w, uint16_t tag, uint64_t v) {
  uint8_t *p = field(w, tag, 8);
  if (p) tp_put64(p, v);
}

void tp_put_i32(struct tp_writer *w, uint16_t tag, int32_t v) { tp_put_u32(w, tag, (uint32_t)v); }

void tp_put_i64(struct tp_writer *w, uint16_t tag, int64_t v) { tp_put_u64(w, tag, (uint64_t)v); }

void tp_put_bool(struct tp_writer *w, uint16_t tag, int v) {
  uint8_t *p = field(w, tag, 1);
  if (p) p[0] = v ? 1 : 0;
}

void tp_put_bytes(struct tp_writer *w, uint16_t tag, const void *src, size_t n) {
  uint8_t *p = field(w, tag, n);
  if (p) tp_copy(p, (const uint8_t *)src, n);
}

void tp_put_str(struct tp_writer *w, uint16_t tag, const char *s) { tp_put_bytes(w, tag, s, tp_strlen(s)); }

size_t tp_put_begin(struct tp_writer *w, uint16_t tag) {
  size_t mark = w->len;
  if (!field(w, tag, 0)) return (size_t)-1;
  return mark;
}

void tp_put_end(struct tp_writer *w, size_t mark) {
  if (w->overflow || mark == (size_t)-1) return;
  size_t n = w->len - mark - TP_FIELD_HEADER_SIZE;
  if (n > 0xffffffffu) {
    w->overflow = 1;
    return;
  }
  tp_put32(w->buf + mark + 2, (uint32_t)n);
}
