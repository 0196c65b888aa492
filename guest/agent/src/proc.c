#include "proc.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include "errors.h"
#include "log.h"
#include "reqid.h"

static struct proc *procs; /* newest first */
static unsigned ended_count;
static uint64_t ended_seq;
static int evict_pending; /* an ended process may be evictable: look at the next tick */

/* Output frames carry at most this much data: big enough for throughput, small enough
 * to interleave streams fairly. */
#define OUT_CHUNK (128u * 1024u)
/* Bytes of stdin a process may have queued across all its STDIN requests. */
#define STDIN_QUEUE_MAX (16u << 20)

static void free_strv(char **v) {
  if (!v) return;
  for (char **p = v; *p; p++) free(*p);
  free(v);
}

struct proc *proc_first(void) { return procs; }

struct proc *proc_find(pid_t pid) {
  for (struct proc *p = procs; p; p = p->next)
    if (p->pid == pid) return p;
  return NULL;
}

int proc_exit_code(const struct proc *p) {
  if (WIFEXITED(p->status)) return WEXITSTATUS(p->status);
  if (WIFSIGNALED(p->status)) return 128 + WTERMSIG(p->status);
  return -1;
}

int proc_term_signal(const struct proc *p) { return WIFSIGNALED(p->status) ? WTERMSIG(p->status) : 0; }

/* ---- output ---- */

static uint64_t backlog(const struct proc_out *o) {
  uint64_t worst = 0;
  for (struct proc_sub *s = o->p->subs; s; s = s->next) {
    uint64_t off = s->off[o->which];
    if (o->ring.end > off && o->ring.end - off > worst) worst = o->ring.end - off;
  }
  return worst;
}

static void update_out_interest(struct proc_out *o) {
  if (!o->open) return;
  o->paused = backlog(o) >= PROC_PAUSE_BACKLOG;
  /* Paused: out of epoll entirely, or a hung-up pipe would wake the loop forever. */
  if (o->paused)
    loop_unwatch(&o->w);
  else
    loop_watch(&o->w, EPOLLIN);
}

static void out_close(struct proc_out *o) {
  if (!o->open) return;
  loop_unwatch(&o->w);
  close(o->w.fd);
  o->w.fd = -1;
  o->open = 0;
  o->paused = 0;
}

/* Reads what is there, as much as the slowest subscriber allows. */
static void out_read(struct proc_out *o, int rounds) {
  static uint8_t tmp[64 * 1024];
  for (int i = 0; i < rounds && o->open; i++) {
    uint64_t b = backlog(o);
    if (b >= PROC_PAUSE_BACKLOG) break;
    size_t room = RING_MAX - (size_t)b;
    ssize_t n = read(o->w.fd, tmp, room < sizeof tmp ? room : sizeof tmp);
    if (n > 0) {
      if (ring_append(&o->ring, tmp, (size_t)n) != 0) log_error("pid %d: output dropped: out of memory", o->p->pid);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    out_close(o); /* EOF, or EIO from a pty whose slave side is gone */
  }
}

static void pump_subs(struct proc *p) {
  struct proc_sub *next;
  for (struct proc_sub *s = p->subs; s; s = next) {
    next = s->next; /* the pump may end (and free) s */
    proc_sub_pump(s);
  }
}

static void stdin_fail_all(struct proc *p, int err);

static void proc_free(struct proc *p) {
  ring_free(&p->out[0].ring);
  ring_free(&p->out[1].ring);
  free_strv(p->argv);
  free_strv(p->env);
  free(p->shell);
  free(p->cwd);
  free(p->tag);
  free(p);
}

/* An ended process nobody is reading from may lose its tails or leave the table. */
static int idle_ended(const struct proc *p) { return p->finished && !p->subs; }

static size_t kept_bytes(const struct proc *p) { return p->out[0].ring.cap + p->out[1].ring.cap; }

/* The oldest idle ended process with kept output (want_output) or at all; NULL if none. */
static struct proc **oldest_idle_ended(int want_output) {
  struct proc **oldest = NULL;
  for (struct proc **pp = &procs; *pp; pp = &(*pp)->next)
    if (idle_ended(*pp) && (!want_output || kept_bytes(*pp)) && (!oldest || (*pp)->ended_seq < (*oldest)->ended_seq))
      oldest = pp;
  return oldest;
}

static void evict_ended(void) {
  while (ended_count > PROC_KEEP_ENDED) {
    struct proc **oldest = oldest_idle_ended(0);
    if (!oldest) break; /* all watched right now: evict later */
    struct proc *p = *oldest;
    *oldest = p->next;
    proc_free(p);
    ended_count--;
  }
  size_t total = 0;
  for (struct proc *p = procs; p; p = p->next)
    if (idle_ended(p)) total += kept_bytes(p);
  while (total > PROC_ENDED_OUTPUT_BUDGET) {
    struct proc **oldest = oldest_idle_ended(1);
    if (!oldest) break;
    total -= kept_bytes(*oldest);
    ring_release(&(*oldest)->out[0].ring);
    ring_release(&(*oldest)->out[1].ring);
  }
}

static void stdin_close(struct proc *p) {
  if (p->stdin_fd < 0) return;
  loop_unwatch(&p->stdin_w);
  close(p->stdin_fd);
  p->stdin_fd = -1;
}

static void maybe_finish(struct proc *p) {
  if (p->finished || !p->reaped || p->out[0].open || p->out[1].open) return;
  p->finished = 1;
  p->ended_seq = ++ended_seq;
  ended_count++;
  stdin_fail_all(p, EPIPE);
  stdin_close(p);
  pump_subs(p);
  /* Eviction waits for proc_tick: a later event of this loop iteration may still point
   * at this process's watchers. */
  evict_pending = 1;
}

static void on_out(struct watcher *w, uint32_t events) {
  (void)events;
  struct proc_out *o = w->ctx;
  struct proc *p = o->p;
  out_read(o, 4);
  pump_subs(p);
  update_out_interest(&p->out[0]);
  update_out_interest(&p->out[1]);
  maybe_finish(p);
}

/* ---- subscribers ---- */

struct proc_sub *proc_subscribe(struct proc *p, struct stream *s, uint64_t off_out, uint64_t off_err) {
  struct proc_sub *sub = calloc(1, sizeof *sub);
  if (!sub) return NULL;
  sub->p = p;
  sub->s = s;
  sub->off[0] = off_out;
  sub->off[1] = off_err;
  sub->next = p->subs;
  p->subs = sub;
  return sub;
}

void proc_unsubscribe(struct proc_sub *sub) {
  struct proc *p = sub->p;
  for (struct proc_sub **pp = &p->subs; *pp; pp = &(*pp)->next) {
    if (*pp == sub) {
      *pp = sub->next;
      break;
    }
  }
  free(sub);
  /* The slowest reader may be gone: resume reading; the process may be evictable now. */
  update_out_interest(&p->out[0]);
  update_out_interest(&p->out[1]);
  if (p->finished) evict_pending = 1;
}

static void send_exited(struct proc_sub *sub) {
  struct stream *s = sub->s;
  struct proc *p = sub->p;
  struct tp_writer w;
  if (answer_begin(s, &w, 64, TP_EXITED) != 0) return;
  tp_put_i32(&w, TP_T_EXIT_CODE, proc_exit_code(p));
  int sig = proc_term_signal(p);
  if (sig) tp_put_u32(&w, TP_T_SIGNAL, (uint32_t)sig);
  if (p->timed_out) tp_put_bool(&w, TP_T_TIMED_OUT, 1);
  answer_end(s, &w); /* closes s, which unsubscribes (frees) sub */
}

void proc_sub_pump(struct proc_sub *sub) {
  struct stream *s = sub->s;
  struct conn *c = s->conn;
  struct proc *p = sub->p;
  for (int which = 0; which < 2; which++) {
    struct ring *r = &p->out[which].ring;
    while (sub->off[which] < r->end) {
      if (s->send_window <= 0 || conn_backlogged(c)) goto blocked;
      uint64_t off = sub->off[which];
      if (off < r->start) {
        answer_error(s, CODE_OUTPUT_LOST, 0, "output fell out of the kept 1 MiB tail");
        return;
      }
      size_t n = (size_t)(r->end - off);
      if (n > OUT_CHUNK) n = OUT_CHUNK;
      if ((uint64_t)n > (uint64_t)s->send_window) n = (size_t)s->send_window;
      struct tp_writer w;
      if (frame_begin(c, &w, 2 * TP_FIELD_HEADER_SIZE + 8 + n, s->id, which ? TP_STDERR : TP_STDOUT, 0) != 0)
        return;
      tp_put_u64(&w, TP_T_OFFSET, off);
      /* The data field straight from the ring into the output buffer. */
      uint8_t *field = w.buf + w.len;
      tp_put16(field, TP_T_DATA);
      tp_put32(field + 2, (uint32_t)n);
      ring_copy(r, off, field + TP_FIELD_HEADER_SIZE, n);
      w.len += TP_FIELD_HEADER_SIZE + n;
      frame_end(c, &w);
      if (c->dead) return;
      sub->off[which] += n;
      s->send_window -= (int64_t)n;
    }
  }
  if (p->finished) {
    send_exited(sub);
    return;
  }
blocked:
  /* This reader may have been the one holding the pipes back. */
  update_out_interest(&p->out[0]);
  update_out_interest(&p->out[1]);
}

/* ---- stdin ---- */

static void stdin_req_free(struct stdin_req *q) {
  if (q->s) q->s->state = NULL;
  free(q->data);
  free(q);
}

void proc_stdin_forget_stream(struct stdin_req *req) { req->s = NULL; }

static void stdin_fail_all(struct proc *p, int err) {
  while (p->stdin_head) {
    struct stdin_req *q = p->stdin_head;
    p->stdin_head = q->next;
    struct stream *s = q->s;
    if (!s && q->remember) reqid_forget(q->request_id); /* not written: asking again may run it */
    stdin_req_free(q);
    if (s) {
      s->on_close = NULL;
      answer_errno(s, err, "the process's stdin is closed");
    }
  }
  p->stdin_tail = NULL;
  p->stdin_queued = 0;
}

static void stdin_pump(struct proc *p) {
  while (p->stdin_head && p->stdin_fd >= 0) {
    struct stdin_req *q = p->stdin_head;
    while (q->done < q->len) {
      ssize_t n = write(p->stdin_fd, q->data + q->done, q->len - q->done);
      if (n > 0) {
        q->done += (size_t)n;
        p->stdin_queued -= (size_t)n;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        loop_watch(&p->stdin_w, EPOLLOUT);
        return;
      }
      int err = n < 0 ? errno : EIO;
      stdin_fail_all(p, err);
      stdin_close(p);
      return;
    }
    p->stdin_head = q->next;
    if (!p->stdin_head) p->stdin_tail = NULL;
    struct stream *s = q->s;
    int close_after = q->close_after;
    if (!s && q->remember) reqid_complete(q->request_id, TP_OK, TP_FLAG_END, (const uint8_t *)"", 0);
    stdin_req_free(q);
    if (close_after) {
      if (p->is_pty) {
        /* A terminal has no end of file: ^D is what a reader at a line start sees as one. */
        static const uint8_t eot = 4;
        ssize_t n = write(p->stdin_fd, &eot, 1);
        (void)n;
      }
      stdin_fail_all(p, EPIPE);
      stdin_close(p);
    }
    if (s) {
      s->on_close = NULL;
      if (s->conn->dead && s->remember) {
        /* Its connection is gone but not yet collected: the id must still read as done. */
        reqid_complete(s->request_id, TP_OK, TP_FLAG_END, (const uint8_t *)"", 0);
        s->remember = 0;
      }
      answer_ok(s);
    }
  }
  if (p->stdin_fd >= 0) loop_unwatch(&p->stdin_w);
}

static void on_stdin_writable(struct watcher *w, uint32_t events) {
  (void)events;
  stdin_pump(w->ctx);
}

static void stdin_stream_closed(struct stream *s) {
  struct stdin_req *q = s->state;
  if (!q) return;
  q->s = NULL;
  if (s->remember) {
    /* The bytes stay queued: the request id follows them instead of being forgotten. */
    q->remember = 1;
    q->request_id = s->request_id;
    s->remember = 0;
  }
}

int proc_stdin_enqueue(struct proc *p, struct stream *s, const uint8_t *data, size_t len, int close_after) {
  if (p->stdin_fd < 0) return EPIPE;
  if (p->stdin_queued + len > STDIN_QUEUE_MAX) return EAGAIN;
  struct stdin_req *q = calloc(1, sizeof *q);
  if (!q) return ENOMEM;
  q->data = malloc(len ? len : 1);
  if (!q->data) {
    free(q);
    return ENOMEM;
  }
  memcpy(q->data, data, len);
  q->len = len;
  q->close_after = close_after;
  q->s = s;
  s->state = q;
  s->on_close = stdin_stream_closed;
  if (p->stdin_tail)
    p->stdin_tail->next = q;
  else
    p->stdin_head = q;
  p->stdin_tail = q;
  p->stdin_queued += len;
  stdin_pump(p);
  return 0;
}

/* ---- table ---- */

struct proc *proc_add(const struct spawn_result *r, int is_pty, uint32_t timeout_ms, char **argv, char *shell,
                      char *cwd, char *tag, char **env) {
  struct proc *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->pid = r->pid;
  p->argv = argv;
  p->shell = shell;
  p->cwd = cwd;
  p->tag = tag;
  p->env = env;
  p->is_pty = is_pty;
  int fds[2] = {r->out_fd, r->err_fd};
  for (int i = 0; i < 2; i++) {
    struct proc_out *o = &p->out[i];
    o->p = p;
    o->which = i;
    o->w.fd = fds[i];
    o->w.fn = on_out;
    o->w.ctx = o;
    o->open = fds[i] >= 0;
    if (o->open) loop_watch(&o->w, EPOLLIN);
  }
  p->stdin_fd = r->in_fd;
  p->stdin_w.fd = r->in_fd;
  p->stdin_w.fn = on_stdin_writable;
  p->stdin_w.ctx = p;
  if (timeout_ms) p->deadline_ms = now_ms() + timeout_ms;
  p->next = procs;
  procs = p;
  return p;
}

void proc_reap_children(void) {
  for (;;) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid <= 0) {
      if (pid < 0 && errno == EINTR) continue;
      return;
    }
    struct proc *p = proc_find(pid);
    if (!p || p->reaped) continue; /* an orphan that was re-parented to us */
    p->reaped = 1;
    p->status = status;
    p->deadline_ms = 0;
    p->drain_deadline_ms = now_ms() + PROC_DRAIN_MS;
    /* What it wrote before exiting is in the pipe already: take it now. */
    for (int i = 0; i < 2; i++)
      if (!p->out[i].paused) out_read(&p->out[i], 64);
    pump_subs(p);
    maybe_finish(p);
  }
}

void proc_tick(void) {
  uint64_t now = now_ms();
  struct proc *next;
  for (struct proc *p = procs; p; p = next) {
    next = p->next;
    if (!p->reaped && p->deadline_ms && now >= p->deadline_ms) {
      p->deadline_ms = 0;
      p->timed_out = 1;
      kill(-p->pid, SIGKILL);
      kill(p->pid, SIGKILL); /* in case it left its group */
    }
    if (p->reaped && !p->finished && now >= p->drain_deadline_ms) {
      /* An orphan still holds the pipe: take what is there, then stop waiting. A paused
       * output first waits for its slow reader (checked again shortly). */
      int waiting = 0;
      for (int i = 0; i < 2; i++) {
        struct proc_out *o = &p->out[i];
        if (!o->open) continue;
        if (o->paused) {
          waiting = 1;
          continue;
        }
        out_read(o, 64);
        if (backlog(o) >= PROC_PAUSE_BACKLOG)
          waiting = 1;
        else
          out_close(o);
      }
      if (waiting) p->drain_deadline_ms = now + 50;
      pump_subs(p);
      maybe_finish(p);
    }
  }
  if (evict_pending) {
    evict_pending = 0;
    evict_ended();
  }
}

uint64_t proc_next_deadline(void) {
  if (evict_pending) return 0; /* evict or trim at the next tick */
  uint64_t d = UINT64_MAX;
  for (struct proc *p = procs; p; p = p->next) {
    if (!p->reaped && p->deadline_ms && p->deadline_ms < d) d = p->deadline_ms;
    if (p->reaped && !p->finished && p->drain_deadline_ms < d) d = p->drain_deadline_ms;
  }
  return d;
}

void proc_table_init(void) {}

void proc_kill_all(void) {
  for (struct proc *p = procs; p; p = p->next) {
    if (p->reaped) continue;
    kill(-p->pid, SIGKILL);
    kill(p->pid, SIGKILL);
  }
}
