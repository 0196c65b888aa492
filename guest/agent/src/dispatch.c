#include "dispatch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "errors.h"
#include "handlers.h"
#include "log.h"
#include "reqid.h"
#include "watch.h"

static int init_mode;

void dispatch_set_init_mode(int m) { init_mode = m; }
int dispatch_init_mode(void) { return init_mode; }

int field_cstr(const struct tp_field *fl, char **dst) {
  char *s = strndup_checked(fl->value, fl->len);
  if (!s) return -1;
  free(*dst);
  *dst = s;
  return 0;
}

typedef void (*handler_fn)(struct stream *s, const struct frame *f);

static handler_fn handler_for(uint16_t type) {
  switch (type) {
    case TP_EXEC: return handle_exec;
    case TP_ATTACH: return handle_attach;
    case TP_STDIN: return handle_stdin;
    case TP_PROC_SIGNAL: return handle_proc_signal;
    case TP_PROC_LIST: return handle_proc_list;
    case TP_PTY_RESIZE: return handle_pty_resize;
    case TP_FILE_READ: return handle_file_read;
    case TP_FILE_WRITE: return handle_file_write;
    case TP_FILE_LIST: return handle_file_list;
    case TP_FILE_STAT: return handle_file_stat;
    case TP_MKDIR: return handle_mkdir;
    case TP_REMOVE: return handle_remove;
    case TP_RENAME: return handle_rename;
    case TP_WATCH: return handle_watch;
    case TP_SYNC: return handle_sync;
    case TP_POWEROFF: return handle_poweroff;
    case TP_RESUMED: return handle_resumed;
    case TP_ECHO: return handle_echo;
    case TP_GROW_FS: return handle_grow_fs;
    default: return NULL;
  }
}

static void send_hello(struct conn *c) {
  struct tp_writer w;
  char name[64];
  snprintf(name, sizeof name, "torpor-agent %s", agent_version());
  if (frame_begin(c, &w, 128, 0, TP_HELLO, 0) != 0) return;
  tp_put_u32(&w, TP_T_VERSION, TP_PROTOCOL_VERSION);
  tp_put_u64(&w, TP_T_FEATURES,
             TP_FEATURE_EXEC | TP_FEATURE_PTY | TP_FEATURE_FILES | TP_FEATURE_ATTACH | TP_FEATURE_RESUMED |
                 TP_FEATURE_REQUEST_IDS | TP_FEATURE_USERS | TP_FEATURE_WATCH | TP_FEATURE_GROW_FS |
                 TP_FEATURE_IDENTITY);
  tp_put_str(&w, TP_T_NAME, name);
  tp_put_i64(&w, TP_T_TIME_NS, wall_ns());
  frame_end(c, &w);
}

static void on_hello(struct conn *c, const struct frame *f) {
  struct tp_reader r;
  struct tp_field fl;
  uint32_t version = 0;
  int have_version = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_)
    if (fl.tag == TP_T_VERSION) have_version = tp_field_u32(&fl, &version) == TP_OK_;
  if (!have_version || version != TP_PROTOCOL_VERSION) {
    conn_goaway(c, CODE_PROTOCOL_ERROR, "this agent speaks protocol version 1 only");
    return;
  }
  c->hello_done = 1;
  send_hello(c);
}

static void on_ping(struct conn *c, const struct frame *f) {
  struct tp_reader r;
  struct tp_field fl;
  struct tp_writer w;
  const uint8_t *nonce = NULL;
  uint32_t nonce_len = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_)
    if (fl.tag == TP_T_NONCE) {
      nonce = fl.value;
      nonce_len = fl.len;
    }
  if (frame_begin(c, &w, TP_FIELD_HEADER_SIZE + TP_MAX_NONCE, 0, TP_PONG, 0) != 0) return;
  if (nonce) tp_put_bytes(&w, TP_T_NONCE, nonce, nonce_len);
  frame_end(c, &w);
}

static void unknown_type(struct conn *c, uint32_t stream, uint16_t type) {
  struct tp_writer w;
  char msg[64];
  snprintf(msg, sizeof msg, "unexpected frame type %u", (unsigned)type);
  if (frame_begin(c, &w, 128, stream, TP_ERR, TP_FLAG_END | TP_FLAG_ERROR) != 0) return;
  tp_put_str(&w, TP_T_CODE, CODE_PROTOCOL_ERROR);
  tp_put_str(&w, TP_T_MESSAGE, msg);
  frame_end(c, &w);
}

static void control_frame(struct conn *c, const struct frame *f) {
  if (!c->hello_done && f->h.type != TP_HELLO && f->h.type != TP_PING) {
    conn_goaway(c, CODE_PROTOCOL_ERROR, "the first frame must be HELLO");
    return;
  }
  switch (f->h.type) {
    case TP_HELLO: on_hello(c, f); break;
    case TP_PING: on_ping(c, f); break;
    case TP_PONG: break;
    case TP_GOAWAY: conn_close(c, "goaway"); break;
    case TP_CREDIT: case TP_CANCEL:
      conn_goaway(c, CODE_PROTOCOL_ERROR, "CREDIT and CANCEL belong on a request's stream");
      break;
    default: unknown_type(c, 0, f->h.type); break;
  }
}

static int find_request_id(const struct frame *f, uint64_t *id) {
  struct tp_reader r;
  struct tp_field fl;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_)
    if (fl.tag == TP_T_REQUEST_ID) return tp_field_u64(&fl, id) == TP_OK_;
  return 0;
}

/* A request whose id the agent remembers: answer from memory instead of running it. */
static int answer_from_memory(struct stream *s, const struct reqid_entry *e) {
  struct tp_writer w;
  switch (e->state) {
    case REQID_PENDING:
      if (answer_begin(s, &w, 16, TP_OK) != 0) return 1;
      tp_put_bool(&w, TP_T_PENDING, 1);
      frame_end(s->conn, &w);
      stream_close(s);
      return 1;
    case REQID_DONE:
      if (frame_begin(s->conn, &w, e->answer_len, s->id, e->type, e->flags) != 0) return 1;
      /* The stored payload is already encoded fields: copy it in as is. */
      tp_copy(w.buf + w.len, e->answer, e->answer_len);
      w.len += e->answer_len;
      frame_end(s->conn, &w);
      stream_close(s);
      return 1;
    case REQID_EXEC:
      if (s->kind != TP_EXEC) return 0;
      exec_attach_pid(s, (uint32_t)e->pid, 0, 0);
      return 1;
  }
  return 0;
}

static void new_request(struct conn *c, const struct frame *f) {
  uint32_t id = f->h.stream;
  if (!c->hello_done) {
    conn_goaway(c, CODE_PROTOCOL_ERROR, "the first frame must be HELLO");
    return;
  }
  if ((id & 1) == 0 || id <= c->last_stream) {
    conn_goaway(c, CODE_PROTOCOL_ERROR, "requests use new, increasing odd stream ids");
    return;
  }
  c->last_stream = id;
  handler_fn fn = handler_for(f->h.type);
  if (!fn) {
    unknown_type(c, id, f->h.type);
    return;
  }
  if (c->open_streams >= CONN_MAX_STREAMS) {
    struct tp_writer w;
    if (frame_begin(c, &w, 128, id, TP_ERR, TP_FLAG_END | TP_FLAG_ERROR) != 0) return;
    tp_put_str(&w, TP_T_CODE, CODE_REQUEST_FAILED);
    tp_put_str(&w, TP_T_MESSAGE, "too many open streams on this connection");
    frame_end(c, &w);
    return;
  }
  struct stream *s = stream_open(c, id, f->h.type);
  if (!s) {
    conn_close(c, "out of memory");
    return;
  }
  s->has_request_id = find_request_id(f, &s->request_id);
  if (s->has_request_id && reqid_is_remembered_type(f->h.type)) {
    const struct reqid_entry *e = reqid_find(s->request_id);
    if (e && answer_from_memory(s, e)) return;
    reqid_begin(s->request_id);
    s->remember = 1;
  }
  fn(s, f);
}

void dispatch_frame(struct conn *c, const struct frame *f) {
  if (f->h.stream == 0) {
    control_frame(c, f);
    return;
  }
  struct stream *s = stream_find(c, f->h.stream);
  if (!s) {
    /* Late CREDIT/CANCEL/DATA for a stream the agent already ended are expected. */
    if (f->h.stream <= c->last_stream && handler_for(f->h.type) == NULL) return;
    new_request(c, f);
    return;
  }
  switch (f->h.type) {
    case TP_CREDIT: {
      struct tp_reader r;
      struct tp_field fl;
      uint32_t credit = 0;
      tp_reader_init(&r, f->payload, f->h.length);
      while (tp_reader_next(&r, &fl) == TP_OK_)
        if (fl.tag == TP_T_CREDIT) tp_field_u32(&fl, &credit);
      s->send_window += credit;
      if (s->send_window > (int64_t)1 << 40) {
        conn_goaway(c, CODE_PROTOCOL_ERROR, "credit window overflow");
        return;
      }
      if (s->on_writable && !conn_backlogged(c)) s->on_writable(s);
      return;
    }
    case TP_CANCEL:
      s->cancelled = 1;
      stream_close(s);
      return;
    default:
      if (s->on_frame) {
        s->on_frame(s, f);
      } else {
        unknown_type(c, s->id, f->h.type);
        stream_close(s);
      }
  }
}
