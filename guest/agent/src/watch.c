#include "watch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"
#include "handlers.h"
#include "log.h"
#include "users.h"
#include "util.h"

enum ev_kind { EV_CREATE, EV_WRITE, EV_REMOVE, EV_RENAME, EV_CHMOD, EV_OVERFLOW };
static const char *const ev_names[] = {"create", "write", "remove", "rename", "chmod", "overflow"};

struct wevent {
  uint8_t kind;
  char *name; /* relative to the watched directory */
};

struct wdir {
  int wd;
  char *rel; /* "" for the root */
};

struct watch {
  struct watch *next;
  uint32_t id;
  struct watcher w; /* the inotify fd */
  char *root;
  int recursive;
  struct wdir *dirs;
  size_t ndirs, capdirs;
  struct wevent *ring; /* WATCH_QUEUE slots; seq n lives at ring[n % WATCH_QUEUE] */
  uint64_t first_seq;  /* oldest kept */
  uint64_t next_seq;   /* the next event's seq (seqs start at 1) */
  size_t name_bytes;   /* of the kept events' names (bounded by WATCH_QUEUE_BYTES) */
  struct stream *s;    /* attached stream, or NULL */
  uint64_t send_seq;   /* next seq to send to s */
  uint64_t detached_ms;
  int ended; /* the root is gone: END once the queue is sent */
  uint32_t temp_cookie; /* a rename out of the agent's own temporary file (FILE_WRITE) */
};

static struct watch *watches;
static unsigned nwatches;
static uint32_t next_id = 1;

#define WATCH_MASK                                                                                        \
  (IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF | \
   IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)

static void watch_free(struct watch *wt) {
  for (struct watch **pp = &watches; *pp; pp = &(*pp)->next)
    if (*pp == wt) {
      *pp = wt->next;
      break;
    }
  nwatches--;
  loop_unwatch(&wt->w);
  close(wt->w.fd);
  for (size_t i = 0; i < wt->ndirs; i++) free(wt->dirs[i].rel);
  free(wt->dirs);
  for (uint64_t q = wt->first_seq; q < wt->next_seq; q++) free(wt->ring[q % WATCH_QUEUE].name);
  free(wt->ring);
  free(wt->root);
  free(wt);
}

static void drop_oldest(struct watch *wt) {
  char *name = wt->ring[wt->first_seq % WATCH_QUEUE].name;
  if (name) wt->name_bytes -= strlen(name);
  free(name);
  wt->first_seq++;
}

static void push(struct watch *wt, enum ev_kind kind, const char *name) {
  char *copy = strdup(name);
  if (!copy) { /* out of memory: the event is lost, and said to be */
    kind = EV_OVERFLOW;
    name = "";
  }
  size_t len = copy ? strlen(copy) : 0;
  /* Full (events, or bytes of names): the oldest go; a reader behind them gets an overflow. */
  while (wt->first_seq < wt->next_seq &&
         (wt->next_seq - wt->first_seq == WATCH_QUEUE || wt->name_bytes + len > WATCH_QUEUE_BYTES))
    drop_oldest(wt);
  struct wevent *e = &wt->ring[wt->next_seq % WATCH_QUEUE];
  e->kind = (uint8_t)kind;
  e->name = copy; /* NULL: sent as "" */
  wt->name_bytes += len;
  wt->next_seq++;
}

static int send_event(struct watch *wt, uint64_t seq, enum ev_kind kind, const char *name, uint64_t dropped) {
  struct tp_writer w;
  size_t n = strlen(name);
  if (frame_begin(wt->s->conn, &w, 64 + n, wt->s->id, TP_EVENT, 0) != 0) return -1;
  tp_put_u64(&w, TP_T_SEQ, seq);
  tp_put_str(&w, TP_T_EVENT, ev_names[kind]);
  tp_put_bytes(&w, TP_T_PATH, name, n);
  if (kind == EV_OVERFLOW) tp_put_u64(&w, TP_T_DROPPED, dropped);
  frame_end(wt->s->conn, &w);
  return 0;
}

/* Sends the attached stream what it has not seen, while its connection takes more. */
static void pump(struct watch *wt) {
  while (wt->s && wt->send_seq < wt->next_seq && !conn_backlogged(wt->s->conn)) {
    if (wt->send_seq < wt->first_seq) {
      /* Overwritten before they were sent (a slow or absent reader): say how many. */
      if (send_event(wt, wt->first_seq - 1, EV_OVERFLOW, "", wt->first_seq - wt->send_seq) != 0) return;
      wt->send_seq = wt->first_seq;
      continue;
    }
    const struct wevent *e = &wt->ring[wt->send_seq % WATCH_QUEUE];
    if (send_event(wt, wt->send_seq, (enum ev_kind)e->kind, e->name ? e->name : "", 0) != 0) return;
    wt->send_seq++;
  }
  if (wt->s && wt->ended && wt->send_seq == wt->next_seq) {
    struct stream *s = wt->s;
    struct tp_writer w;
    if (answer_begin(s, &w, 16, TP_OK) == 0) answer_end(s, &w); /* closes s: watch_stream_closed frees wt */
  }
}

static struct wdir *dir_by_wd(struct watch *wt, int wd) {
  for (size_t i = 0; i < wt->ndirs; i++)
    if (wt->dirs[i].wd == wd) return &wt->dirs[i];
  return NULL;
}

static int is_agent_temp(const char *name);

/* Watches the directory root/rel and, for a recursive watch, every directory below it. With
 * `report` (a directory that appeared while watching) what is already inside is reported as
 * created (and written, when not empty): it got there before its directory was watched. */
static int add_tree(struct watch *wt, const char *rel, int level, int report) {
  if (wt->ndirs >= WATCH_MAX_DIRS || level > 64) {
    errno = ENOSPC;
    return -1;
  }
  char path[TP_MAX_PATH * 2 + 2];
  snprintf(path, sizeof path, "%s%s%s", wt->root, *rel ? "/" : "", rel);
  int wd = inotify_add_watch(wt->w.fd, path, WATCH_MASK);
  if (wd < 0) return -1;
  if (!dir_by_wd(wt, wd)) {
    if (wt->ndirs == wt->capdirs) {
      size_t cap = wt->capdirs ? wt->capdirs * 2 : 16;
      struct wdir *d = realloc(wt->dirs, cap * sizeof *d);
      if (!d) return -1;
      wt->dirs = d;
      wt->capdirs = cap;
    }
    char *copy = strdup(rel);
    if (!copy) return -1;
    wt->dirs[wt->ndirs].wd = wd;
    wt->dirs[wt->ndirs].rel = copy;
    wt->ndirs++;
  }
  if (!wt->recursive) return 0;
  DIR *d = opendir(path);
  if (!d) return 0; /* gone already: its removal is reported */
  struct dirent *de;
  int rc = 0;
  while ((de = readdir(d)) && rc == 0) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || is_agent_temp(de->d_name)) continue;
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    char sub[TP_MAX_PATH + 1];
    int n = snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", de->d_name);
    if (n < 0 || (size_t)n > TP_MAX_PATH) continue;
    if (report) {
      push(wt, EV_CREATE, sub);
      if (S_ISREG(st.st_mode) && st.st_size > 0) push(wt, EV_WRITE, sub);
    }
    if (S_ISDIR(st.st_mode)) rc = add_tree(wt, sub, level + 1, report);
  }
  closedir(d);
  return rc;
}

/* FILE_WRITE's temporary file (".name.torpor-XXXXXXXX", files.c): not the user's event. */
static int is_agent_temp(const char *name) {
  size_t n = strlen(name);
  const char *mark = n > 16 ? name + n - 16 : NULL;
  return name[0] == '.' && mark && !strncmp(mark, ".torpor-", 8);
}

static void on_inotify(struct watcher *w, uint32_t events) {
  (void)events;
  struct watch *wt = w->ctx;
  char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
  ssize_t len = read(w->fd, buf, sizeof buf);
  if (len <= 0) return;
  for (char *p = buf; p < buf + len;) {
    struct inotify_event *ev = (struct inotify_event *)p;
    p += sizeof *ev + ev->len;
    if (ev->mask & IN_Q_OVERFLOW) {
      push(wt, EV_OVERFLOW, ""); /* the kernel's queue overflowed: a count is not known */
      continue;
    }
    struct wdir *d = dir_by_wd(wt, ev->wd);
    if (!d) continue;
    if (ev->mask & IN_IGNORED) {
      /* The directory's watch is gone (deleted, or its file system unmounted). */
      if (d->rel[0] == 0) wt->ended = 1;
      free(d->rel);
      *d = wt->dirs[--wt->ndirs];
      continue;
    }
    if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
      if (d->rel[0] == 0) wt->ended = 1; /* the watched directory itself went away */
      continue;
    }
    const char *base = ev->len ? ev->name : "";
    if (!*base) continue;
    char name[TP_MAX_PATH + 1];
    int n = snprintf(name, sizeof name, "%s%s%s", d->rel, *d->rel ? "/" : "", base);
    if (n < 0 || (size_t)n > TP_MAX_PATH) continue;
    if (is_agent_temp(base)) {
      if (ev->mask & IN_MOVED_FROM) wt->temp_cookie = ev->cookie;
      continue;
    }
    if (ev->mask & IN_CREATE) push(wt, EV_CREATE, name);
    if (ev->mask & IN_MODIFY) push(wt, EV_WRITE, name);
    if (ev->mask & IN_ATTRIB) push(wt, EV_CHMOD, name);
    if (ev->mask & IN_DELETE) push(wt, EV_REMOVE, name);
    if (ev->mask & IN_MOVED_FROM) push(wt, EV_RENAME, name);
    if (ev->mask & IN_MOVED_TO) {
      push(wt, EV_CREATE, name);
      /* files.write lands by a rename out of its temporary file: report its content too. */
      if (wt->temp_cookie && ev->cookie == wt->temp_cookie) push(wt, EV_WRITE, name);
      wt->temp_cookie = 0;
    }
    if ((ev->mask & (IN_CREATE | IN_MOVED_TO)) && (ev->mask & IN_ISDIR) && wt->recursive) {
      if (add_tree(wt, name, 1, 1) != 0 && errno == ENOSPC) push(wt, EV_OVERFLOW, name);
    }
  }
  pump(wt);
}

static void watch_stream_closed(struct stream *s) {
  struct watch *wt = s->state;
  s->state = NULL;
  if (!wt || wt->s != s) return;
  wt->s = NULL;
  if (s->cancelled || wt->ended) {
    watch_free(wt); /* stopped by the client, or finished */
    return;
  }
  wt->detached_ms = now_ms(); /* the connection went away: keep it for a reattach */
}

static void watch_stream_writable(struct stream *s) {
  if (s->state) pump(s->state);
}

static void attach(struct watch *wt, struct stream *s, uint64_t from_seq) {
  if (wt->s) { /* a reattach while the old connection still looks open: the new one wins */
    struct stream *old = wt->s;
    old->state = NULL;
    wt->s = NULL;
    stream_close(old);
  }
  wt->s = s;
  wt->send_seq = from_seq < 1 ? 1 : from_seq;
  if (wt->send_seq > wt->next_seq) wt->send_seq = wt->next_seq;
  s->state = wt;
  s->on_close = watch_stream_closed;
  s->on_writable = watch_stream_writable;
  struct tp_writer w;
  if (frame_begin(s->conn, &w, 32, s->id, TP_OK, 0) != 0) return;
  tp_put_u32(&w, TP_T_WATCH_ID, wt->id);
  tp_put_u64(&w, TP_T_SEQ, wt->next_seq);
  frame_end(s->conn, &w);
  pump(wt);
}

void handle_watch(struct stream *s, const struct frame *f) {
  struct tp_reader r;
  struct tp_field fl;
  char *path = NULL, *user = NULL;
  uint32_t id = 0;
  uint64_t seq = 0;
  int recursive = 0, bad = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_ && !bad) {
    if (fl.tag == TP_T_PATH) bad = field_cstr(&fl, &path) != 0;
    if (fl.tag == TP_T_USER) bad = field_cstr(&fl, &user) != 0;
    if (fl.tag == TP_T_WATCH_ID) tp_field_u32(&fl, &id);
    if (fl.tag == TP_T_SEQ) tp_field_u64(&fl, &seq);
    if (fl.tag == TP_T_RECURSIVE) tp_field_bool(&fl, &recursive);
  }
  struct user_ctx u;
  if (bad) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "path or user holds a NUL byte");
    goto out;
  }
  if (id) { /* reattach */
    struct watch *wt = watches;
    while (wt && wt->id != id) wt = wt->next;
    if (!wt) {
      answer_error(s, CODE_INVALID_ARGUMENT, ENOENT, "no such watch (it was stopped, or nobody reattached in time)");
      goto out;
    }
    attach(wt, s, seq);
    goto out;
  }
  if (!path || !*path) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "path is required");
    goto out;
  }
  if (users_resolve(user, &u) != 0) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "unknown user (not in /etc/passwd)");
    goto out;
  }
  char *abs = users_path(&u, path);
  if (!abs) {
    answer_error(s, CODE_REQUEST_FAILED, ENOMEM, "out of memory");
    goto out;
  }
  free(path);
  path = abs;
  struct stat st;
  memset(&st, 0, sizeof st);
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
    int e = errno;
    char msg[4200];
    snprintf(msg, sizeof msg, "watch %s: %s", path, st.st_mode && !S_ISDIR(st.st_mode) ? "not a directory" : strerror(e));
    answer_errno(s, st.st_mode && !S_ISDIR(st.st_mode) ? ENOTDIR : e, msg);
    goto out;
  }
  if (nwatches >= WATCH_MAX) {
    answer_error(s, CODE_REQUEST_FAILED, EMFILE, "too many watches (128); stop some");
    goto out;
  }
  struct watch *wt = calloc(1, sizeof *wt);
  if (wt) wt->ring = calloc(WATCH_QUEUE, sizeof *wt->ring);
  if (!wt || !wt->ring) {
    if (wt) free(wt);
    answer_error(s, CODE_REQUEST_FAILED, ENOMEM, "out of memory");
    goto out;
  }
  wt->w.fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (wt->w.fd < 0) {
    int e = errno;
    free(wt->ring);
    free(wt);
    answer_errno(s, e, "inotify_init1 failed");
    goto out;
  }
  wt->id = next_id++;
  if (next_id == 0) next_id = 1;
  wt->root = path;
  path = NULL;
  wt->recursive = recursive;
  wt->first_seq = wt->next_seq = 1;
  wt->w.fn = on_inotify;
  wt->w.ctx = wt;
  wt->next = watches;
  watches = wt;
  nwatches++;
  if (add_tree(wt, "", 0, 0) != 0 || loop_watch(&wt->w, EPOLLIN) != 0) {
    int e = errno;
    char msg[4200];
    snprintf(msg, sizeof msg, "watch %s: %s%s", wt->root, strerror(e),
             e == ENOSPC ? " (too many directories to watch: raise fs.inotify.max_user_watches or watch less)" : "");
    watch_free(wt);
    answer_errno(s, e, msg);
    goto out;
  }
  attach(wt, s, 1);
out:
  free(path);
  free(user);
}

void watch_tick(void) {
  uint64_t now = now_ms();
  for (struct watch *wt = watches, *next; wt; wt = next) {
    next = wt->next;
    if (!wt->s && now - wt->detached_ms >= WATCH_DETACHED_MS) watch_free(wt);
  }
}

uint64_t watch_next_deadline(void) {
  uint64_t d = UINT64_MAX;
  for (struct watch *wt = watches; wt; wt = wt->next)
    if (!wt->s && wt->detached_ms + WATCH_DETACHED_MS < d) d = wt->detached_ms + WATCH_DETACHED_MS;
  return d;
}
