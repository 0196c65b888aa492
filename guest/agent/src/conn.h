/* One client connection: frame input, buffered output, and its multiplexed streams.
 * Frames are written straight into the connection's output buffer (no second copy). */
#ifndef AGENT_CONN_H
#define AGENT_CONN_H

#include <stddef.h>
#include <stdint.h>

#include "frame.h"
#include "loop.h"
#include "util.h"

struct conn;
struct stream;

/* A complete, validated incoming frame (its payload fields are well formed). */
struct frame {
  struct tp_header h;
  const uint8_t *payload;
};

/* The value of the last field `tag` in a frame's payload; NULL and 0 when absent. */
void frame_find_bytes(const struct frame *f, uint16_t tag, const uint8_t **value, size_t *len);

struct stream {
  struct stream *next;
  struct conn *conn;
  uint32_t id;
  uint16_t kind;          /* the request type that opened it */
  int64_t send_window;    /* data bytes the agent may still send on it */
  int64_t recv_window;    /* data bytes the client may still send on it */
  uint64_t request_id;
  int has_request_id;
  int remember;           /* the request-id memory waits for this stream's answer */
  int cancelled;          /* closed by the client's CANCEL (not by a lost connection) */
  void *state;            /* owned by the handler; released by on_close */
  /* Another frame of the client on this open stream (DATA of a FILE_WRITE). */
  void (*on_frame)(struct stream *s, const struct frame *f);
  /* The send window grew (CREDIT) or the connection's output drained. */
  void (*on_writable)(struct stream *s);
  /* The stream ends (answered, cancelled, connection gone): release state. */
  void (*on_close)(struct stream *s);
};

struct conn {
  struct conn *next;
  struct watcher w;
  uint8_t *in;
  size_t in_len, in_cap;
  struct bytebuf out;
  struct stream *streams;
  uint32_t last_stream;
  int hello_done;
  int closing; /* GOAWAY sent or received: flush, then close */
  uint64_t closing_deadline_ms; /* a peer that does not read its GOAWAY is cut off then */
  int dead;    /* closed; freed after the current loop iteration */
  int reading_paused;
  unsigned open_streams;
};

/* Bounds on what one peer can make the agent hold. */
#define CONN_MAX 256            /* connections at once; more are closed at accept */
#define CONN_MAX_STREAMS 4096   /* open streams per connection; more are refused */

/* Output beyond which producers (process output, file reads) wait for the socket. */
#define CONN_OUT_HIGH (1u << 20)

void conn_accept_fd(int fd);
int conn_backlogged(const struct conn *c);
void conn_close(struct conn *c, const char *why);
void conn_goaway(struct conn *c, const char *code, const char *message);
/* Frees connections closed during the iteration, and closes those whose GOAWAY did not
 * drain in time (called from the loop tick). */
void conn_collect(void);
/* When conn_collect has a GOAWAY deadline to enforce; UINT64_MAX when none. */
uint64_t conn_next_deadline(void);

/* How long a connection may take to read its GOAWAY before the agent closes it anyway. */
#define CONN_GOAWAY_DRAIN_MS 2000u
/* Blocks (briefly) until every connection's output is written: before reboot(2). */
void conn_flush_all_blocking(int timeout_ms);

/* Starts a frame of at most max_payload bytes in c's output; -1 when out of memory. */
int frame_begin(struct conn *c, struct tp_writer *w, size_t max_payload, uint32_t stream, uint16_t type,
                uint16_t flags);
/* Commits the frame started by frame_begin and tries to send it. */
void frame_end(struct conn *c, struct tp_writer *w);

struct stream *stream_find(struct conn *c, uint32_t id);
struct stream *stream_open(struct conn *c, uint32_t id, uint16_t kind);
/* Ends the stream without sending anything more (on_close runs). */
void stream_close(struct stream *s);
/* Final answer: frame_begin on the stream with END (and ERROR for ERR). */
int answer_begin(struct stream *s, struct tp_writer *w, size_t max_payload, uint16_t type);
/* Commits it, hands it to the request-id memory, closes the stream. */
void answer_end(struct stream *s, struct tp_writer *w);
/* ERR {code, errno?, message} with END|ERROR, then close. err 0 = no errno field. */
void answer_error(struct stream *s, const char *code, int err, const char *message);
/* answer_error with errno_code(err) and errno_name(err). */
void answer_errno(struct stream *s, int err, const char *message);
/* OK with no fields, END. */
void answer_ok(struct stream *s);

#endif
