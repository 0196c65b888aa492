#include "responder.h"

#include "frame.h"
#include "lib.h"
#include "status.h"

struct responder_stats responder_stats;

#define SERVER_NAME "torpor-testvm 1"
/* Room an answer needs beyond the data it echoes (header, fields, error text). */
#define ANSWER_OVERHEAD 256u

/* Request-id memory: the last few answers, replayed on a re-asked id. */
#define REPLAY_ENTRIES 8
#define REPLAY_MAX 2048u
struct replay_entry {
  int used;
  uint64_t request_id;
  uint16_t type;
  uint16_t flags;
  uint32_t len;
  uint8_t payload[REPLAY_MAX];
};
static struct replay_entry replay[REPLAY_ENTRIES];
static unsigned replay_next;

void responder_reset(struct responder *r) {
  r->in_len = 0;
  r->skip = 0;
  r->out_len = 0;
  r->out_sent = 0;
  r->out_done = 0;
  r->closing = 0;
}

uint32_t responder_feed(struct responder *r, const uint8_t *p, uint32_t n) {
  uint32_t room = RESPONDER_IN_CAP - r->in_len;
  if (n > room) n = room;
  memcpy(r->in + r->in_len, p, n);
  r->in_len += n;
  return n;
}

void responder_sent(struct responder *r, uint32_t n) {
  r->out_done += n;
  if (r->out_done >= r->out_len && r->out_sent >= r->out_len) {
    r->out_len = r->out_sent = r->out_done = 0;
  }
}

static uint32_t out_room(struct responder *r) { return RESPONDER_OUT_CAP - r->out_len; }

/* Starts an answer frame in the free part of `out`. */
static void answer_begin(struct responder *r, struct tp_writer *w, uint32_t stream, uint16_t type, uint16_t flags) {
  tp_writer_init(w, r->out + r->out_len, out_room(r));
  tp_writer_frame(w, stream, type, flags);
}

static const uint8_t *answer_end(struct responder *r, struct tp_writer *w) {
  size_t n = tp_writer_finish(w);
  if (n == 0) return 0; /* cannot happen: room is checked before a frame is handled */
  const uint8_t *frame = r->out + r->out_len;
  r->out_len += (uint32_t)n;
  return frame;
}

static void answer_error(struct responder *r, uint32_t stream, const char *code, const char *message) {
  struct tp_writer w;
  answer_begin(r, &w, stream, TP_ERR, TP_FLAG_ERROR | TP_FLAG_END);
  tp_put_str(&w, TP_T_CODE, code);
  tp_put_str(&w, TP_T_MESSAGE, message);
  answer_end(r, &w);
  responder_stats.errors++;
}

static void goaway(struct responder *r, const char *message) {
  struct tp_writer w;
  answer_begin(r, &w, 0, TP_GOAWAY, 0);
  tp_put_str(&w, TP_T_CODE, "PROTOCOL_ERROR");
  tp_put_str(&w, TP_T_MESSAGE, message);
  answer_end(r, &w);
  r->closing = 1;
  responder_stats.errors++;
}

static struct replay_entry *replay_find(uint64_t id) {
  for (int i = 0; i < REPLAY_ENTRIES; i++)
    if (replay[i].used && replay[i].request_id == id) return &replay[i];
  return 0;
}

static void replay_store(uint64_t id, const uint8_t *frame) {
  struct tp_header h;
  if (tp_header_decode(frame, TP_FRAME_HEADER_SIZE, &h) != TP_OK_ || h.length > REPLAY_MAX) return;
  struct replay_entry *e = &replay[replay_next];
  replay_next = (replay_next + 1) % REPLAY_ENTRIES;
  e->used = 1;
  e->request_id = id;
  e->type = h.type;
  e->flags = h.flags;
  e->len = h.length;
  memcpy(e->payload, frame + TP_FRAME_HEADER_SIZE, h.length);
}

static void replay_send(struct responder *r, uint32_t stream, const struct replay_entry *e) {
  struct tp_header h = {e->len, stream, e->type, e->flags};
  tp_header_encode(r->out + r->out_len, &h);
  memcpy(r->out + r->out_len + TP_FRAME_HEADER_SIZE, e->payload, e->len);
  r->out_len += TP_FRAME_HEADER_SIZE + e->len;
  responder_stats.replays++;
}

static void handle_hello(struct responder *r, const struct tp_header *h, const uint8_t *payload) {
  struct tp_reader rd;
  struct tp_field f;
  uint32_t version = 0;
  tp_reader_init(&rd, payload, h->length);
  while (tp_reader_next(&rd, &f) == TP_OK_)
    if (f.tag == TP_T_VERSION) tp_field_u32(&f, &version);
  if (version != TP_PROTOCOL_VERSION) return goaway(r, "unsupported protocol version");
  struct tp_writer w;
  answer_begin(r, &w, h->stream, TP_HELLO, 0);
  tp_put_u32(&w, TP_T_VERSION, TP_PROTOCOL_VERSION);
  tp_put_u64(&w, TP_T_FEATURES, TP_FEATURE_REQUEST_IDS | TP_FEATURE_RESUMED);
  tp_put_str(&w, TP_T_NAME, SERVER_NAME);
  tp_put_i64(&w, TP_T_TIME_NS, 0); /* no wall clock in the test guest */
  answer_end(r, &w);
  responder_stats.hellos++;
}

static void handle_ping(struct responder *r, const struct tp_header *h, const uint8_t *payload) {
  struct tp_reader rd;
  struct tp_field f;
  const uint8_t *nonce = 0;
  uint32_t nonce_len = 0;
  tp_reader_init(&rd, payload, h->length);
  while (tp_reader_next(&rd, &f) == TP_OK_)
    if (f.tag == TP_T_NONCE) nonce = f.value, nonce_len = f.len;
  struct tp_writer w;
  answer_begin(r, &w, h->stream, TP_PONG, 0);
  if (nonce) tp_put_bytes(&w, TP_T_NONCE, nonce, nonce_len);
  answer_end(r, &w);
  responder_stats.pings++;
}

static void handle_echo(struct responder *r, const struct tp_header *h, const uint8_t *payload) {
  struct tp_reader rd;
  struct tp_field f;
  const uint8_t *data = 0;
  uint32_t data_len = 0;
  uint64_t request_id = 0;
  int have_id = 0;
  tp_reader_init(&rd, payload, h->length);
  while (tp_reader_next(&rd, &f) == TP_OK_) {
    if (f.tag == TP_T_DATA) data = f.value, data_len = f.len;
    if (f.tag == TP_T_REQUEST_ID && tp_field_u64(&f, &request_id) == TP_OK_) have_id = 1;
  }
  if (have_id) {
    const struct replay_entry *e = replay_find(request_id);
    if (e) return replay_send(r, h->stream, e);
  }
  struct tp_writer w;
  answer_begin(r, &w, h->stream, TP_OK, TP_FLAG_END);
  tp_put_bytes(&w, TP_T_DATA, data ? data : (const uint8_t *)"", data_len);
  const uint8_t *frame = answer_end(r, &w);
  if (frame && have_id) replay_store(request_id, frame);
  responder_stats.echoes++;
}

/* SYNC and RESUMED: requests with effects, so remembered by request id like ECHO. The test
 * guest has no file system to sync and no clock or RNG to set: it counts them and keeps what
 * RESUMED carried in its status page, where the host reads it (README.md). */
static void handle_lifecycle(struct responder *r, const struct tp_header *h, const uint8_t *payload) {
  struct tp_reader rd;
  struct tp_field f;
  uint64_t request_id = 0;
  int have_id = 0;
  int64_t time_ns = 0;
  const uint8_t *entropy = 0;
  uint32_t entropy_len = 0;
  tp_reader_init(&rd, payload, h->length);
  while (tp_reader_next(&rd, &f) == TP_OK_) {
    if (f.tag == TP_T_REQUEST_ID && tp_field_u64(&f, &request_id) == TP_OK_) have_id = 1;
    if (f.tag == TP_T_TIME_NS) tp_field_i64(&f, &time_ns);
    if (f.tag == TP_T_ENTROPY) entropy = f.value, entropy_len = f.len;
  }
  if (have_id) {
    const struct replay_entry *e = replay_find(request_id);
    if (e) return replay_send(r, h->stream, e);
  }
  if (h->type == TP_SYNC) {
    status_page.syncs++;
  } else {
    uint8_t head[8] = {0};
    for (uint32_t i = 0; i < entropy_len && i < 8; i++) head[i] = entropy[i];
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | head[i];
    status_page.resumed_time_ns = (uint64_t)time_ns;
    status_page.resumed_entropy_len = entropy_len;
    status_page.resumed_entropy_head = v;
    status_page.resumed++;
  }
  struct tp_writer w;
  answer_begin(r, &w, h->stream, TP_OK, TP_FLAG_END);
  const uint8_t *frame = answer_end(r, &w);
  if (frame && have_id) replay_store(request_id, frame);
}

static void handle_frame(struct responder *r, const struct tp_header *h, const uint8_t *payload) {
  responder_stats.frames++;
  if (tp_payload_validate(payload, h->length) != TP_OK_) return goaway(r, "malformed fields");
  switch (h->type) {
    case TP_HELLO:
      if (h->stream != 0) return goaway(r, "HELLO outside stream 0");
      return handle_hello(r, h, payload);
    case TP_PING:
      return handle_ping(r, h, payload);
    case TP_PONG:
    case TP_CREDIT:
    case TP_CANCEL:
      return; /* nothing to do: the test guest never sends data frames */
    case TP_GOAWAY:
      r->closing = 1;
      return;
    case TP_ECHO:
      if (h->stream == 0 || !(h->stream & 1)) return goaway(r, "request on a non-client stream");
      return handle_echo(r, h, payload);
    case TP_SYNC:
    case TP_RESUMED:
      if (h->stream == 0 || !(h->stream & 1)) return goaway(r, "request on a non-client stream");
      return handle_lifecycle(r, h, payload);
    default:
      if (h->type >= TP_EXEC && h->type <= TP_RESUMED)
        return answer_error(r, h->stream, "REQUEST_FAILED", "not served by the test guest");
      return answer_error(r, h->stream, "PROTOCOL_ERROR", "unknown frame type");
  }
}

static void drop_input(struct responder *r, uint32_t n) {
  for (uint32_t i = n; i < r->in_len; i++) r->in[i - n] = r->in[i];
  r->in_len -= n;
}

uint32_t responder_process(struct responder *r) {
  uint32_t consumed = 0;
  while (!r->closing) {
    if (r->skip) {
      uint32_t n = r->skip < r->in_len ? r->skip : r->in_len;
      if (n == 0) break;
      drop_input(r, n);
      r->skip -= n;
      consumed += n;
      continue;
    }
    struct tp_header h;
    int rc = tp_header_decode(r->in, r->in_len, &h);
    if (rc == TP_NEED_MORE) break;
    if (rc != TP_OK_) {
      if (out_room(r) < ANSWER_OVERHEAD) break;
      goaway(r, rc == TP_E_TOO_LARGE ? "frame too large" : "bad frame flags");
      consumed += r->in_len;
      r->in_len = 0;
      break;
    }
    uint32_t total = TP_FRAME_HEADER_SIZE + h.length;
    if (total > RESPONDER_IN_CAP) {
      /* legal but more than this guest buffers: drop it and say so on its stream */
      if (out_room(r) < ANSWER_OVERHEAD) break;
      answer_error(r, h.stream, "REQUEST_FAILED", "frame too large for the test guest");
      drop_input(r, TP_FRAME_HEADER_SIZE);
      consumed += TP_FRAME_HEADER_SIZE;
      r->skip = h.length;
      continue;
    }
    if (r->in_len < total) break;
    /* room for the answer, or for a remembered one that may be larger */
    if (out_room(r) < h.length + ANSWER_OVERHEAD + REPLAY_MAX) break; /* wait for the transport */
    handle_frame(r, &h, r->in + TP_FRAME_HEADER_SIZE);
    drop_input(r, total);
    consumed += total;
  }
  if (r->closing) {
    consumed += r->in_len; /* nothing more is read on a closing connection */
    r->in_len = 0;
    r->skip = 0;
  }
  return consumed;
}
