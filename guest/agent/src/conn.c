#include "conn.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "dispatch.h"
#include "errors.h"
#include "log.h"
#include "reqid.h"

static struct conn *conns;

/* Output beyond which the agent stops reading a client's requests: a client that never
 * reads its answers (PING flood) cannot make the agent buffer without bound. */
#define CONN_OUT_STOP_READING (8u << 20)

int conn_backlogged(const struct conn *c) { return c->dead || bytebuf_pending(&c->out) >= CONN_OUT_HIGH; }

static void update_interest(struct conn *c) {
  if (c->dead) return;
  uint32_t ev = 0;
  c->reading_paused = bytebuf_pending(&c->out) >= CONN_OUT_STOP_READING;
  if (!c->closing && !c->reading_paused) ev |= EPOLLIN;
  if (bytebuf_pending(&c->out)) ev |= EPOLLOUT;
  loop_watch(&c->w, ev);
}

static void notify_writable(struct conn *c) {
  /* A handler may close streams (even this one) from its callback: walk by id. */
  uint32_t after = 0;
  for (;;) {
    struct stream *next = NULL;
    for (struct stream *s = c->streams; s; s = s->next)
      if (s->id > after && (!next || s->id < next->id)) next = s;
    if (!next || c->dead || conn_backlogged(c)) return;
    after = next->id;
    if (next->on_writable) next->on_writable(next);
  }
}

/* Writes what it can without blocking. */
static void flush(struct conn *c) {
  int was_high = bytebuf_pending(&c->out) >= CONN_OUT_HIGH;
  while (bytebuf_pending(&c->out)) {
    ssize_t n = write(c->w.fd, c->out.p + c->out.off, bytebuf_pending(&c->out));
    if (n > 0) {
      bytebuf_consume(&c->out, (size_t)n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    conn_close(c, n < 0 ? strerror(errno) : "write returned 0");
    return;
  }
  if (c->closing && !bytebuf_pending(&c->out)) {
    conn_close(c, "goaway");
    return;
  }
  update_interest(c);
  if (was_high && !conn_backlogged(c)) notify_writable(c);
}

int frame_begin(struct conn *c, struct tp_writer *w, size_t max_payload, uint32_t stream, uint16_t type,
                uint16_t flags) {
  if (max_payload > TP_MAX_PAYLOAD) max_payload = TP_MAX_PAYLOAD;
  uint8_t *p = c->dead ? NULL : bytebuf_reserve(&c->out, TP_FRAME_HEADER_SIZE + max_payload);
  if (!p) {
    tp_writer_init(w, NULL, 0);
    w->overflow = 1;
    if (!c->dead) conn_close(c, "out of memory");
    return -1;
  }
  tp_writer_init(w, p, TP_FRAME_HEADER_SIZE + max_payload);
  tp_writer_frame(w, stream, type, flags);
  return 0;
}

void frame_end(struct conn *c, struct tp_writer *w) {
  if (c->dead) return;
  size_t n = tp_writer_finish(w);
  if (n == 0) {
    /* A bug in a handler's size estimate; the peer gets a clear error instead. */
    log_error("frame did not fit its reserved size");
    return;
  }
  int was_empty = bytebuf_pending(&c->out) == 0;
  c->out.len += n;
  if (was_empty) flush(c); /* else EPOLLOUT is armed already */
}

struct stream *stream_find(struct conn *c, uint32_t id) {
  for (struct stream *s = c->streams; s; s = s->next)
    if (s->id == id) return s;
  return NULL;
}

struct stream *stream_open(struct conn *c, uint32_t id, uint16_t kind) {
  struct stream *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->conn = c;
  s->id = id;
  s->kind = kind;
  s->send_window = TP_INITIAL_WINDOW;
  s->recv_window = TP_INITIAL_WINDOW;
  s->next = c->streams;
  c->streams = s;
  c->open_streams++;
  return s;
}

void stream_close(struct stream *s) {
  struct conn *c = s->conn;
  if (s->on_close) s->on_close(s);
  if (s->remember) reqid_forget(s->request_id); /* never answered: asking again runs it */
  for (struct stream **pp = &c->streams; *pp; pp = &(*pp)->next) {
    if (*pp == s) {
      *pp = s->next;
      c->open_streams--;
      break;
    }
  }
  free(s);
}

int answer_begin(struct stream *s, struct tp_writer *w, size_t max_payload, uint16_t type) {
  uint16_t flags = TP_FLAG_END | (type == TP_ERR ? TP_FLAG_ERROR : 0);
  return frame_begin(s->conn, w, max_payload, s->id, type, flags);
}

void answer_end(struct stream *s, struct tp_writer *w) {
  if (!w->overflow && s->remember) {
    size_t start = w->frame_start;
    const uint8_t *hdr = w->buf + start;
    reqid_complete(s->request_id, tp_get16(hdr + 8), tp_get16(hdr + 10), hdr + TP_FRAME_HEADER_SIZE,
                   w->len - start - TP_FRAME_HEADER_SIZE);
    s->remember = 0;
  }
  frame_end(s->conn, w);
  stream_close(s);
}

void answer_error(struct stream *s, const char *code, int err, const char *message) {
  struct tp_writer w;
  size_t mlen = message ? strlen(message) : 0;
  if (mlen > 4000) mlen = 4000;
  if (answer_begin(s, &w, 128 + mlen, TP_ERR) != 0) return;
  tp_put_str(&w, TP_T_CODE, code);
  if (err) tp_put_str(&w, TP_T_ERRNO, errno_name(err));
  if (message) tp_put_bytes(&w, TP_T_MESSAGE, message, mlen);
  answer_end(s, &w);
}

void answer_errno(struct stream *s, int err, const char *message) {
  answer_error(s, errno_code(err), err, message);
}

void frame_find_bytes(const struct frame *f, uint16_t tag, const uint8_t **value, size_t *len) {
  struct tp_reader r;
  struct tp_field fl;
  *value = NULL;
  *len = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_)
    if (fl.tag == tag) {
      *value = fl.value;
      *len = fl.len;
    }
}

void answer_ok(struct stream *s) {
  struct tp_writer w;
  if (answer_begin(s, &w, 0, TP_OK) != 0) return;
  answer_end(s, &w);
}

void conn_goaway(struct conn *c, const char *code, const char *message) {
  if (c->dead || c->closing) return;
  struct tp_writer w;
  if (frame_begin(c, &w, 64 + strlen(code) + strlen(message), 0, TP_GOAWAY, 0) != 0) return;
  tp_put_str(&w, TP_T_CODE, code);
  tp_put_str(&w, TP_T_MESSAGE, message);
  c->closing = 1;
  c->closing_deadline_ms = now_ms() + CONN_GOAWAY_DRAIN_MS;
  log_info("connection %d: goaway %s: %s", c->w.fd, code, message);
  frame_end(c, &w);
  if (!c->dead) flush(c);
}

void conn_close(struct conn *c, const char *why) {
  if (c->dead) return;
  c->dead = 1;
  if (why && strcmp(why, "eof") != 0 && strcmp(why, "goaway") != 0) log_info("connection %d closed: %s", c->w.fd, why);
  /* Streams are torn down later, in conn_collect: the caller may be walking a list of
   * subscribers that includes this connection's streams. */
  loop_unwatch(&c->w);
  close(c->w.fd);
}

uint64_t conn_next_deadline(void) {
  uint64_t d = UINT64_MAX;
  for (struct conn *c = conns; c; c = c->next)
    if (c->closing && !c->dead && c->closing_deadline_ms < d) d = c->closing_deadline_ms;
  return d;
}

void conn_collect(void) {
  uint64_t now = now_ms();
  for (struct conn *c = conns; c; c = c->next)
    if (c->closing && !c->dead && now >= c->closing_deadline_ms) {
      log_error("connection %d: GOAWAY not read in time: closing it", c->w.fd);
      conn_close(c, NULL);
    }
  for (struct conn **pp = &conns; *pp;) {
    struct conn *c = *pp;
    if (!c->dead) {
      pp = &c->next;
      continue;
    }
    *pp = c->next;
    while (c->streams) stream_close(c->streams);
    free(c->in);
    bytebuf_free(&c->out);
    free(c);
  }
}

void conn_flush_all_blocking(int timeout_ms) {
  uint64_t end = now_ms() + (uint64_t)timeout_ms;
  for (struct conn *c = conns; c; c = c->next) {
    while (!c->dead && bytebuf_pending(&c->out) && now_ms() < end) {
      struct pollfd p = {c->w.fd, POLLOUT, 0};
      poll(&p, 1, 50);
      flush(c);
    }
  }
}

/* Parses and dispatches every complete frame in the input buffer. */
static void process_input(struct conn *c) {
  size_t pos = 0;
  /* A burst of requests already read (PINGs, ECHOs of 1 MiB) stops being answered once the
   * answers back up: the rest waits in c->in until the peer reads (on_conn_event). */
  while (!c->dead && !c->closing && bytebuf_pending(&c->out) < CONN_OUT_STOP_READING) {
    struct tp_header h;
    int rc = tp_header_decode(c->in + pos, c->in_len - pos, &h);
    if (rc == TP_NEED_MORE) break;
    if (rc != TP_OK_) {
      conn_goaway(c, CODE_PROTOCOL_ERROR, rc == TP_E_TOO_LARGE ? "frame length above 1 MiB (2.5 MiB for EXEC)" : "unknown flag bits");
      return;
    }
    size_t total = TP_FRAME_HEADER_SIZE + (size_t)h.length;
    if (c->in_len - pos < total) {
      if (c->in_cap < total) {
        /* Make room for the whole frame (bounded by the header check above). */
        uint8_t *p = malloc(total);
        if (!p) {
          conn_close(c, "out of memory");
          return;
        }
        memcpy(p, c->in + pos, c->in_len - pos);
        free(c->in);
        c->in = p;
        c->in_len -= pos;
        c->in_cap = total;
        pos = 0;
      }
      break;
    }
    struct frame f = {h, c->in + pos + TP_FRAME_HEADER_SIZE};
    if (tp_payload_validate(f.payload, h.length) != TP_OK_) {
      conn_goaway(c, CODE_PROTOCOL_ERROR, "malformed fields in a frame payload");
      return;
    }
    pos += total;
    dispatch_frame(c, &f);
  }
  if (c->dead) return;
  if (pos) {
    memmove(c->in, c->in + pos, c->in_len - pos);
    c->in_len -= pos;
  }
}

static void on_conn_event(struct watcher *w, uint32_t events) {
  struct conn *c = w->ctx;
  if (events & EPOLLOUT) {
    flush(c);
    if (c->dead) return;
    /* Frames read earlier and held back while the answers backed up. */
    if (c->in_len && !c->closing && bytebuf_pending(&c->out) < CONN_OUT_STOP_READING) {
      process_input(c);
      if (c->dead) return;
      update_interest(c);
    }
  }
  if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR)) || c->closing) return;
  for (int rounds = 0; rounds < 16 && !c->dead && !c->closing && bytebuf_pending(&c->out) < CONN_OUT_STOP_READING;
       rounds++) {
    if (c->in_cap - c->in_len < 4096) {
      size_t cap = c->in_cap * 2;
      uint8_t *p = realloc(c->in, cap);
      if (!p) {
        conn_close(c, "out of memory");
        return;
      }
      c->in = p;
      c->in_cap = cap;
    }
    ssize_t n = read(c->w.fd, c->in + c->in_len, c->in_cap - c->in_len);
    if (n > 0) {
      c->in_len += (size_t)n;
      process_input(c);
      /* Shrink back after a large frame went through. */
      if (!c->dead && c->in_cap > (256u << 10) && c->in_len < (64u << 10)) {
        uint8_t *p = malloc(256u << 10);
        if (p) {
          memcpy(p, c->in, c->in_len);
          free(c->in);
          c->in = p;
          c->in_cap = 256u << 10;
        }
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    conn_close(c, n == 0 ? "eof" : strerror(errno));
    return;
  }
  if (!c->dead) update_interest(c);
}

void conn_accept_fd(int fd) {
  unsigned live = 0;
  for (struct conn *c = conns; c; c = c->next) live += !c->dead;
  if (live >= CONN_MAX) {
    log_error("%u connections open already: refusing one more", live);
    close(fd);
    return;
  }
  struct conn *c = calloc(1, sizeof *c);
  uint8_t *in = malloc(64u << 10);
  if (!c || !in) {
    free(c);
    free(in);
    close(fd);
    return;
  }
  c->in = in;
  c->in_cap = 64u << 10;
  c->w.fd = fd;
  c->w.fn = on_conn_event;
  c->w.ctx = c;
  c->next = conns;
  conns = c;
  if (loop_watch(&c->w, EPOLLIN) != 0) conn_close(c, "epoll");
}
