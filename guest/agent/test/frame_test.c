/* Self-test and fuzz of proto/frame.c, built with ASan + UBSan (make -C guest/agent test).
 * Every buffer handed to the decoder is a malloc of exactly its length, so a read one
 * byte past the end is caught by ASan. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "check.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static uint8_t *dup_exact(const uint8_t *p, size_t n) {
  uint8_t *q = malloc(n ? n : 1);
  if (n) memcpy(q, p, n);
  return q;
}

static void test_header(void) {
  uint8_t b[12];
  struct tp_header h = {5, 7, TP_PING, TP_FLAG_END}, d;
  tp_header_encode(b, &h);
  CHECK(b[0] == 5 && b[4] == 7 && b[8] == TP_PING && b[10] == 1);
  CHECK(tp_header_decode(b, 12, &d) == TP_OK_);
  CHECK(d.length == 5 && d.stream == 7 && d.type == TP_PING && d.flags == TP_FLAG_END);
  for (size_t n = 0; n < 12; n++) CHECK(tp_header_decode(b, n, &d) == TP_NEED_MORE);
  h.length = TP_MAX_PAYLOAD;
  tp_header_encode(b, &h);
  CHECK(tp_header_decode(b, 12, &d) == TP_OK_);
  h.length = TP_MAX_PAYLOAD + 1;
  tp_header_encode(b, &h);
  CHECK(tp_header_decode(b, 12, &d) == TP_E_TOO_LARGE);
  h.length = 0xffffffffu;
  tp_header_encode(b, &h);
  CHECK(tp_header_decode(b, 12, &d) == TP_E_TOO_LARGE);
  /* EXEC alone may carry Linux's argument sizes. */
  h.type = TP_EXEC;
  h.length = TP_MAX_EXEC_PAYLOAD;
  tp_header_encode(b, &h);
  CHECK(tp_header_decode(b, 12, &d) == TP_OK_);
  h.length = TP_MAX_EXEC_PAYLOAD + 1;
  tp_header_encode(b, &h);
  CHECK(tp_header_decode(b, 12, &d) == TP_E_TOO_LARGE);
  h.type = TP_PING;
  h.length = 0;
  h.flags = 4;
  tp_header_encode(b, &h);
  CHECK(tp_header_decode(b, 12, &d) == TP_E_BAD_FLAGS);
}

static void test_roundtrip(void) {
  uint8_t buf[512];
  struct tp_writer w;
  tp_writer_init(&w, buf, sizeof buf);
  tp_writer_frame(&w, 3, TP_EXEC, 0);
  tp_put_u64(&w, TP_T_REQUEST_ID, 0x1122334455667788ull);
  tp_put_str(&w, TP_T_ARG, "echo");
  tp_put_str(&w, TP_T_ARG, "hi");
  tp_put_i32(&w, TP_T_EXIT_CODE, -3);
  tp_put_bool(&w, TP_T_STDIN, 1);
  tp_put_u32(&w, 999, 42); /* unknown tag: must be skipped by readers */
  size_t mark = tp_put_begin(&w, TP_T_ENTRY);
  tp_put_str(&w, TP_T_PATH, "/a");
  tp_put_i64(&w, TP_T_MTIME_NS, -1);
  tp_put_end(&w, mark);
  size_t n = tp_writer_finish(&w);
  CHECK(n > 12 && !w.overflow);

  struct tp_header h;
  CHECK(tp_header_decode(buf, n, &h) == TP_OK_);
  CHECK(h.length == n - 12 && h.stream == 3 && h.type == TP_EXEC);
  uint8_t *payload = dup_exact(buf + 12, h.length);
  CHECK(tp_payload_validate(payload, h.length) == TP_OK_);

  struct tp_reader r;
  struct tp_field f;
  tp_reader_init(&r, payload, h.length);
  uint64_t id = 0;
  int args = 0, saw_entry = 0, saw_unknown = 0, b = 0;
  int32_t code = 0;
  int rc;
  while ((rc = tp_reader_next(&r, &f)) == TP_OK_) {
    switch (f.tag) {
      case TP_T_REQUEST_ID: CHECK(tp_field_u64(&f, &id) == TP_OK_); break;
      case TP_T_ARG: args++; break;
      case TP_T_EXIT_CODE: CHECK(tp_field_i32(&f, &code) == TP_OK_); break;
      case TP_T_STDIN: CHECK(tp_field_bool(&f, &b) == TP_OK_); break;
      case TP_T_ENTRY: {
        struct tp_reader r2;
        struct tp_field f2;
        int64_t mt = 0;
        tp_reader_init(&r2, f.value, f.len);
        CHECK(tp_reader_next(&r2, &f2) == TP_OK_ && f2.tag == TP_T_PATH && f2.len == 2);
        CHECK(tp_reader_next(&r2, &f2) == TP_OK_ && tp_field_i64(&f2, &mt) == TP_OK_ && mt == -1);
        CHECK(tp_reader_next(&r2, &f2) == TP_END);
        saw_entry = 1;
        break;
      }
      default: saw_unknown = f.tag == 999; break;
    }
  }
  CHECK(rc == TP_END);
  CHECK(id == 0x1122334455667788ull && args == 2 && code == -3 && b == 1 && saw_entry && saw_unknown);

  /* Every strict prefix that cuts a field is a protocol error, never a read past it. */
  for (size_t cut = 0; cut < h.length; cut++) {
    uint8_t *p = dup_exact(payload, cut);
    int v = tp_payload_validate(p, cut);
    struct tp_reader rr;
    struct tp_field ff;
    tp_reader_init(&rr, p, cut);
    size_t boundary = 0; /* a cut right after a whole field is valid */
    while (tp_reader_next(&rr, &ff) == TP_OK_) boundary = rr.pos;
    CHECK(v == (boundary == cut ? TP_OK_ : TP_E_TRUNCATED));
    free(p);
  }
  free(payload);
}

static void test_bad_fields(void) {
  uint8_t b[16];
  /* u32 field with 3 bytes */
  tp_put16(b, TP_T_PID);
  tp_put32(b + 2, 3);
  b[6] = b[7] = b[8] = 0;
  CHECK(tp_payload_validate(b, 9) == TP_E_BAD_FIELD);
  /* bool of 2 */
  tp_put16(b, TP_T_RECURSIVE);
  tp_put32(b + 2, 1);
  b[6] = 2;
  CHECK(tp_payload_validate(b, 7) == TP_E_BAD_FIELD);
  /* field length running past the payload */
  tp_put16(b, TP_T_NAME);
  tp_put32(b + 2, 0xffffffffu);
  CHECK(tp_payload_validate(b, 10) == TP_E_TRUNCATED);
  /* trailing bytes shorter than a field header */
  tp_put16(b, TP_T_NAME);
  tp_put32(b + 2, 0);
  CHECK(tp_payload_validate(b, 6) == TP_OK_);
  CHECK(tp_payload_validate(b, 8) == TP_E_TRUNCATED);
  /* nonce above 64 bytes */
  uint8_t big[6 + 65] = {0};
  tp_put16(big, TP_T_NONCE);
  tp_put32(big + 2, 65);
  CHECK(tp_payload_validate(big, sizeof big) == TP_E_BAD_FIELD);
  tp_put32(big + 2, 64);
  CHECK(tp_payload_validate(big, 70) == TP_OK_);
}

static void test_writer_overflow(void) {
  for (size_t cap = 0; cap < 64; cap++) {
    uint8_t *buf = malloc(cap ? cap : 1);
    struct tp_writer w;
    tp_writer_init(&w, buf, cap);
    tp_writer_frame(&w, 1, TP_OK, TP_FLAG_END);
    tp_put_str(&w, TP_T_MESSAGE, "hello world");
    size_t m = tp_put_begin(&w, TP_T_ENTRY);
    tp_put_u32(&w, TP_T_PID, 1);
    tp_put_end(&w, m);
    size_t n = tp_writer_finish(&w);
    CHECK(w.len <= cap);
    CHECK((n == 0) == (cap < 12 + 17 + 6 + 10));
    free(buf);
  }
}

/* Random bytes, with field headers biased towards plausible tags and small lengths so
 * the fuzzer goes past the first field. */
static void fuzz(unsigned iterations) {
  unsigned ok = 0, bad = 0;
  for (unsigned it = 0; it < iterations; it++) {
    size_t n = rnd() % 96;
    uint8_t *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rnd();
    size_t pos = 0;
    while (pos + 6 <= n && (rnd() & 3)) {
      tp_put16(p + pos, (uint16_t)(rnd() % 50));
      uint32_t len = (uint32_t)(rnd() % 12);
      if ((rnd() & 15) == 0) len = (uint32_t)rnd();
      tp_put32(p + pos + 2, len);
      pos += 6 + len;
    }
    struct tp_reader r;
    struct tp_field f;
    tp_reader_init(&r, p, n);
    int rc;
    while ((rc = tp_reader_next(&r, &f)) == TP_OK_) {
      CHECK(f.value >= p && f.value + f.len <= p + n);
      uint32_t u32;
      uint64_t u64;
      int b;
      volatile uint8_t sink = 0;
      for (uint32_t i = 0; i < f.len; i++) sink ^= f.value[i]; /* ASan: in bounds */
      (void)sink;
      (void)tp_field_u32(&f, &u32);
      (void)tp_field_u64(&f, &u64);
      (void)tp_field_bool(&f, &b);
      if (f.tag == TP_T_ENTRY) (void)tp_payload_validate(f.value, f.len);
    }
    if (rc == TP_END) ok++; else bad++;
    CHECK(rc == TP_END || rc < 0);

    /* The same bytes as a stream of frames, cut at a random point. */
    size_t avail = n ? rnd() % (n + 1) : 0;
    struct tp_header h;
    int hr = tp_header_decode(p, avail, &h);
    CHECK(hr == TP_NEED_MORE || hr == TP_OK_ || hr == TP_E_TOO_LARGE || hr == TP_E_BAD_FLAGS);
    if (hr == TP_OK_ && 12 + (size_t)h.length <= avail) (void)tp_payload_validate(p + 12, h.length);
    free(p);
  }
  printf("fuzz: %u payloads, %u well formed, %u rejected\n", iterations, ok, bad);
  CHECK(ok > 0 && bad > 0);
}

/* Valid payloads from the writer, then mutated: a flipped byte, a cut, a grown length. */
static void fuzz_mutations(unsigned iterations) {
  static const uint16_t tags[] = {TP_T_VERSION, TP_T_FEATURES, TP_T_NAME, TP_T_NONCE, TP_T_PATH, TP_T_RECURSIVE,
                                  TP_T_EXIT_CODE, TP_T_ENTRY, TP_T_DATA, 777};
  unsigned valid_after = 0;
  for (unsigned it = 0; it < iterations; it++) {
    uint8_t buf[256];
    struct tp_writer w;
    tp_writer_init(&w, buf, sizeof buf);
    unsigned nfields = (unsigned)(rnd() % 6);
    for (unsigned i = 0; i < nfields; i++) {
      uint16_t tag = tags[rnd() % (sizeof tags / sizeof tags[0])];
      switch (tag) {
        case TP_T_VERSION: case TP_T_EXIT_CODE: tp_put_u32(&w, tag, (uint32_t)rnd()); break;
        case TP_T_FEATURES: tp_put_u64(&w, tag, rnd()); break;
        case TP_T_RECURSIVE: tp_put_bool(&w, tag, (int)(rnd() & 1)); break;
        case TP_T_ENTRY: {
          size_t m = tp_put_begin(&w, tag);
          tp_put_u32(&w, TP_T_PID, 7);
          tp_put_str(&w, TP_T_PATH, "/x");
          tp_put_end(&w, m);
          break;
        }
        default: {
          uint8_t v[40];
          size_t n = rnd() % sizeof v;
          for (size_t k = 0; k < n; k++) v[k] = (uint8_t)rnd();
          tp_put_bytes(&w, tag, v, n);
        }
      }
    }
    CHECK(!w.overflow && tp_payload_validate(buf, w.len) == TP_OK_);
    size_t n = w.len;
    switch (rnd() % 3) {
      case 0: if (n) buf[rnd() % n] ^= (uint8_t)(1u << (rnd() % 8)); break;
      case 1: n = n ? rnd() % n : 0; break;
      default: if (n >= 6) tp_put32(buf + 2, tp_get32(buf + 2) + 1 + (uint32_t)(rnd() % 3)); break;
    }
    uint8_t *p = dup_exact(buf, n);
    int rc = tp_payload_validate(p, n);
    if (rc == TP_OK_) valid_after++;
    CHECK(rc == TP_OK_ || rc == TP_E_TRUNCATED || rc == TP_E_BAD_FIELD);
    struct tp_reader r;
    struct tp_field f;
    tp_reader_init(&r, p, n);
    while (tp_reader_next(&r, &f) == TP_OK_)
      if (f.tag == TP_T_ENTRY) (void)tp_payload_validate(f.value, f.len);
    free(p);
  }
  printf("mutations: %u payloads, %u still well formed\n", iterations, valid_after);
}

int main(int argc, char **argv) {
  unsigned iterations = argc > 1 ? (unsigned)strtoul(argv[1], 0, 10) : 300000;
  test_header();
  test_roundtrip();
  test_bad_fields();
  test_writer_overflow();
  fuzz(iterations);
  fuzz_mutations(iterations);
  if (failures) {
    fprintf(stderr, "frame_test: %d failure(s)\n", failures);
    return 1;
  }
  printf("frame_test: all checks passed\n");
  return 0;
}
