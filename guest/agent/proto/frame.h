/* Frame codec of the torpor agent protocol, version 1 (docs/protocol.md).
 *
 * Plain C with no libc dependence (only <stdint.h> and <stddef.h>, no malloc, no stdio,
 * no memcpy) so the freestanding test guest (guest/testvm) links the very same code as
 * the agent. Everything here works on caller-owned buffers and checks every length
 * against the spec's bounds before touching a byte: the peer is untrusted. */
#ifndef TORPOR_PROTO_FRAME_H
#define TORPOR_PROTO_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define TP_PROTOCOL_VERSION 1u

#define TP_FRAME_HEADER_SIZE 12u
#define TP_FIELD_HEADER_SIZE 6u
#define TP_MAX_PAYLOAD (1024u * 1024u)
#define TP_MAX_FRAME (TP_FRAME_HEADER_SIZE + TP_MAX_PAYLOAD)
/* An EXEC request may be larger: its argv and env, like Linux's (about 2 MiB in all with the
 * default 8 MiB stack), plus the field headers. Only a client that saw the `users` feature
 * sends one over TP_MAX_PAYLOAD. */
#define TP_MAX_EXEC_PAYLOAD (2560u * 1024u)
#define TP_MAX_DATA (TP_MAX_PAYLOAD - 64u)
#define TP_MAX_STR (64u * 1024u)
/* An exec string (argv element, shell, env entry): Linux's MAX_ARG_STRLEN (128 KiB with
 * its terminating NUL). */
#define TP_MAX_ARG (128u * 1024u - 1u)
#define TP_MAX_PATH 4096u
#define TP_MAX_NONCE 64u
#define TP_MAX_TAG_LABEL 256u
#define TP_MAX_ENTROPY 512u
#define TP_INITIAL_WINDOW 262144u

#define TP_FLAG_END 0x1u
#define TP_FLAG_ERROR 0x2u
#define TP_FLAGS_KNOWN (TP_FLAG_END | TP_FLAG_ERROR)

/* features bits announced in HELLO */
#define TP_FEATURE_EXEC (1ull << 0)
#define TP_FEATURE_PTY (1ull << 1)
#define TP_FEATURE_FILES (1ull << 2)
#define TP_FEATURE_ATTACH (1ull << 3)
#define TP_FEATURE_RESUMED (1ull << 4)
#define TP_FEATURE_REQUEST_IDS (1ull << 5)
#define TP_FEATURE_USERS (1ull << 6)
#define TP_FEATURE_WATCH (1ull << 7)
#define TP_FEATURE_GROW_FS (1ull << 8)
#define TP_FEATURE_IDENTITY (1ull << 9)

enum tp_frame_type {
  TP_HELLO = 1,
  TP_PING = 2,
  TP_PONG = 3,
  TP_CREDIT = 4,
  TP_CANCEL = 5,
  TP_GOAWAY = 6,
  TP_EXEC = 16,
  TP_ATTACH = 17,
  TP_STDIN = 18,
  TP_PROC_SIGNAL = 19,
  TP_PROC_LIST = 20,
  TP_PTY_RESIZE = 21,
  TP_FILE_READ = 32,
  TP_FILE_WRITE = 33,
  TP_FILE_LIST = 34,
  TP_FILE_STAT = 35,
  TP_MKDIR = 36,
  TP_REMOVE = 37,
  TP_RENAME = 38,
  TP_WATCH = 39,
  TP_SYNC = 48,
  TP_POWEROFF = 49,
  TP_RESUMED = 50,
  TP_ECHO = 51,
  TP_GROW_FS = 52,
  TP_OK = 64,
  TP_STARTED = 65,
  TP_STDOUT = 66,
  TP_STDERR = 67,
  TP_EXITED = 68,
  TP_DATA = 69,
  TP_ERR = 70,
  TP_EVENT = 71
};

enum tp_tag {
  TP_T_VERSION = 1,
  TP_T_FEATURES = 2,
  TP_T_NAME = 3,
  TP_T_NONCE = 4,
  TP_T_REQUEST_ID = 5,
  TP_T_CREDIT = 6,
  TP_T_CODE = 7,
  TP_T_ERRNO = 8,
  TP_T_MESSAGE = 9,
  TP_T_PATH = 10,
  TP_T_PATH2 = 11,
  TP_T_ARG = 12,
  TP_T_SHELL = 13,
  TP_T_ENV = 14,
  TP_T_UID = 15,
  TP_T_GID = 16,
  TP_T_USER = 17,
  TP_T_TIMEOUT_MS = 18,
  TP_T_PTY_ROWS = 19,
  TP_T_PTY_COLS = 20,
  TP_T_TAG = 21,
  TP_T_PID = 22,
  TP_T_SIGNAL = 23,
  TP_T_EXIT_CODE = 24,
  TP_T_OFFSET = 25,
  TP_T_OFFSET2 = 26,
  TP_T_DATA = 27,
  TP_T_MODE = 28,
  TP_T_DEPTH = 29,
  TP_T_RECURSIVE = 30,
  TP_T_ENTRY = 31,
  TP_T_TYPE = 32,
  TP_T_SIZE = 33,
  TP_T_MTIME_NS = 34,
  TP_T_TARGET = 35,
  TP_T_RUNNING = 36,
  TP_T_TIME_NS = 37,
  TP_T_ENTROPY = 38,
  TP_T_REBOOT = 39,
  TP_T_STDIN = 40,
  TP_T_TIMED_OUT = 41,
  TP_T_UID_OUT = 42,
  TP_T_PENDING = 43,
  TP_T_STDOUT_START = 44,
  TP_T_STDERR_START = 45,
  TP_T_GID_OUT = 46,
  TP_T_OWNER = 47,
  TP_T_GROUP = 48,
  TP_T_FOLLOW = 49,
  TP_T_EVENT = 50,
  TP_T_SEQ = 51,
  TP_T_WATCH_ID = 52,
  TP_T_DROPPED = 53,
  TP_T_FS_SIZE = 54,
  TP_T_HOSTNAME = 55,
  TP_T_MACHINE_ID = 56,
  TP_T_MAC = 57
};

/* Results of the decoders. Negative values are protocol errors: the connection closes. */
enum tp_status {
  TP_OK_ = 0,
  TP_NEED_MORE = 1,      /* not enough bytes yet (header decode only) */
  TP_END = 2,            /* reader: no more fields */
  TP_E_TOO_LARGE = -1,   /* frame length above TP_MAX_PAYLOAD */
  TP_E_BAD_FLAGS = -2,   /* flag bits other than END and ERROR */
  TP_E_TRUNCATED = -3,   /* field header or value runs past the payload */
  TP_E_BAD_FIELD = -4,   /* known tag with a length its kind does not allow */
  TP_E_OVERFLOW = -5     /* writer: the buffer is full */
};

struct tp_header {
  uint32_t length; /* payload bytes */
  uint32_t stream;
  uint16_t type;
  uint16_t flags;
};

/* Little-endian load/store, independent of host byte order and alignment. */
uint16_t tp_get16(const uint8_t *p);
uint32_t tp_get32(const uint8_t *p);
uint64_t tp_get64(const uint8_t *p);
void tp_put16(uint8_t *p, uint16_t v);
void tp_put32(uint8_t *p, uint32_t v);
void tp_put64(uint8_t *p, uint64_t v);
void tp_copy(uint8_t *dst, const uint8_t *src, size_t n);
size_t tp_strlen(const char *s);

/* Decodes the header at buf[0..avail). Returns TP_NEED_MORE when avail < 12, TP_OK_
 * when *out is valid (the payload may still be incomplete: check avail against
 * TP_FRAME_HEADER_SIZE + out->length), or a negative tp_status. A bad length or flags
 * is reported as soon as the 12 header bytes are there, before any payload arrives. */
int tp_header_decode(const uint8_t *buf, size_t avail, struct tp_header *out);
void tp_header_encode(uint8_t out[TP_FRAME_HEADER_SIZE], const struct tp_header *h);

/* ---- Reading fields of a payload ---- */
struct tp_field {
  uint16_t tag;
  uint32_t len;
  const uint8_t *value; /* points into the payload; len bytes */
};

struct tp_reader {
  const uint8_t *p;
  size_t len;
  size_t pos;
};

void tp_reader_init(struct tp_reader *r, const uint8_t *payload, size_t len);
/* TP_OK_ with *f filled (its length already checked against the tag's kind, see
 * tp_field_check), TP_END after the last field, or a negative tp_status. */
int tp_reader_next(struct tp_reader *r, struct tp_field *f);
/* Walks a whole payload once: TP_OK_ when every field is well formed. */
int tp_payload_validate(const uint8_t *payload, size_t len);

/* Bounds of a known tag: TP_OK_ or TP_E_BAD_FIELD. Unknown tags are always fine. */
int tp_field_check(const struct tp_field *f);

/* Typed accessors; a field of the wrong size gives TP_E_BAD_FIELD. */
int tp_field_u32(const struct tp_field *f, uint32_t *out);
int tp_field_u64(const struct tp_field *f, uint64_t *out);
int tp_field_i32(const struct tp_field *f, int32_t *out);
int tp_field_i64(const struct tp_field *f, int64_t *out);
int tp_field_bool(const struct tp_field *f, int *out);

/* ---- Writing a frame ----
 * The writer owns nothing: it fills buf[0..cap). tp_writer_frame() reserves the header;
 * fields follow; tp_writer_finish() patches the length. Any overflow is sticky and
 * reported by tp_writer_finish()/w->overflow, never a write past cap. */
struct tp_writer {
  uint8_t *buf;
  size_t cap;
  size_t len;
  size_t frame_start;
  int overflow;
};

void tp_writer_init(struct tp_writer *w, uint8_t *buf, size_t cap);
void tp_writer_frame(struct tp_writer *w, uint32_t stream, uint16_t type, uint16_t flags);
/* Returns the whole frame's size (header + payload), or 0 on overflow or when the
 * payload grew past TP_MAX_PAYLOAD. */
size_t tp_writer_finish(struct tp_writer *w);

void tp_put_u32(struct tp_writer *w, uint16_t tag, uint32_t v);
void tp_put_u64(struct tp_writer *w, uint16_t tag, uint64_t v);
void tp_put_i32(struct tp_writer *w, uint16_t tag, int32_t v);
void tp_put_i64(struct tp_writer *w, uint16_t tag, int64_t v);
void tp_put_bool(struct tp_writer *w, uint16_t tag, int v);
void tp_put_bytes(struct tp_writer *w, uint16_t tag, const void *p, size_t n);
void tp_put_str(struct tp_writer *w, uint16_t tag, const char *s);
/* A nested field (e.g. an `entry`): begin returns a mark, end patches its length. */
size_t tp_put_begin(struct tp_writer *w, uint16_t tag);
void tp_put_end(struct tp_writer *w, size_t mark);

#endif
