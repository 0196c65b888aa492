/* EXEC, ATTACH, STDIN, PROC_SIGNAL, PROC_LIST, PTY_RESIZE. */
#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"
#include "handlers.h"
#include "proc.h"
#include "pty.h"
#include "reqid.h"
#include "users.h"

extern char **environ;

/* A growable NULL-terminated string vector. */
struct strv {
  char **v;
  size_t n, cap;
};

static int strv_push(struct strv *sv, char *s) {
  if (sv->n + 2 > sv->cap) {
    size_t cap = sv->cap ? sv->cap * 2 : 8;
    char **v = realloc(sv->v, cap * sizeof *v);
    if (!v) return -1;
    sv->v = v;
    sv->cap = cap;
  }
  sv->v[sv->n++] = s;
  sv->v[sv->n] = NULL;
  return 0;
}

static void strv_free(struct strv *sv) {
  for (size_t i = 0; i < sv->n; i++) free(sv->v[i]);
  free(sv->v);
  memset(sv, 0, sizeof *sv);
}

/* An empty vector still needs its terminating NULL for execvp and PROC_LIST. */
static char **strv_take(struct strv *sv) {
  if (!sv->v && strv_push(sv, NULL) != 0) return NULL;
  if (!sv->v[0]) sv->n = 0;
  char **v = sv->v;
  memset(sv, 0, sizeof *sv);
  return v;
}

struct exec_req {
  struct strv args, env;
  char *shell, *cwd, *user, *tag;
  uint32_t uid, gid, timeout_ms, rows, cols;
  int has_uid, has_gid, has_pty, want_stdin;
};

static void exec_req_free(struct exec_req *q) {
  strv_free(&q->args);
  strv_free(&q->env);
  free(q->shell);
  free(q->cwd);
  free(q->user);
  free(q->tag);
}

/* Parses EXEC's fields; 0, or -1 after answering INVALID_ARGUMENT. */
static int parse_exec(struct stream *s, const struct frame *f, struct exec_req *q) {
  struct tp_reader r;
  struct tp_field fl;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_) {
    int bad = 0;
    char *str = NULL;
    switch (fl.tag) {
      case TP_T_ARG:
      case TP_T_ENV:
        bad = field_cstr(&fl, &str) != 0 || strv_push(fl.tag == TP_T_ARG ? &q->args : &q->env, str) != 0;
        if (bad) free(str);
        if (!bad && fl.tag == TP_T_ENV && !strchr(str, '=')) bad = 1;
        break;
      case TP_T_SHELL: bad = field_cstr(&fl, &q->shell) != 0; break;
      case TP_T_PATH: bad = field_cstr(&fl, &q->cwd) != 0; break;
      case TP_T_USER: bad = field_cstr(&fl, &q->user) != 0; break;
      case TP_T_TAG: bad = field_cstr(&fl, &q->tag) != 0; break;
      case TP_T_UID: q->has_uid = 1; tp_field_u32(&fl, &q->uid); break;
      case TP_T_GID: q->has_gid = 1; tp_field_u32(&fl, &q->gid); break;
      case TP_T_TIMEOUT_MS: tp_field_u32(&fl, &q->timeout_ms); break;
      case TP_T_PTY_ROWS: q->has_pty = 1; tp_field_u32(&fl, &q->rows); break;
      case TP_T_PTY_COLS: q->has_pty = 1; tp_field_u32(&fl, &q->cols); break;
      case TP_T_STDIN: tp_field_bool(&fl, &q->want_stdin); break;
      default: break;
    }
    if (bad) {
      answer_error(s, CODE_INVALID_ARGUMENT, 0, "a string field holds a NUL byte, or an env entry lacks '='");
      return -1;
    }
  }
  if ((q->args.n > 0) == (q->shell != NULL)) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "EXEC needs either arg fields or a shell field");
    return -1;
  }
  if (q->args.n > 0 && !*q->args.v[0]) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "argv[0] is empty");
    return -1;
  }
  if (q->rows > 0xffff || q->cols > 0xffff) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "pty_rows and pty_cols must fit 16 bits");
    return -1;
  }
  return 0;
}

static int env_has_key(char **env, const char *entry) {
  size_t klen = strcspn(entry, "=");
  for (char **e = env; e && *e; e++)
    if (strncmp(*e, entry, klen) == 0 && (*e)[klen] == '=') return 1;
  return 0;
}

/* The agent's environment, minus what the request (or the user switch) overrides,
 * plus the overrides. The strings are borrowed except those in *owned. */
static char **build_env(char **added, struct strv *owned, int is_pty) {
  struct strv out = {0};
  for (char **e = environ; e && *e; e++)
    if (!env_has_key(added, *e) && !env_has_key(owned->v, *e)) strv_push(&out, *e);
  for (char **e = owned->v; e && *e; e++)
    if (!env_has_key(added, *e)) strv_push(&out, *e);
  for (char **e = added; e && *e; e++) strv_push(&out, *e);
  if (is_pty && !env_has_key(out.v, "TERM=")) strv_push(&out, "TERM=xterm-256color");
  return strv_take(&out);
}

static void exec_stream_closed(struct stream *s) {
  if (s->state) proc_unsubscribe(s->state);
  s->state = NULL;
}

static void exec_stream_writable(struct stream *s) {
  if (s->state) proc_sub_pump(s->state);
}

/* STARTED, then output from the offsets, then EXITED (proc_sub_pump). */
static void start_streaming(struct stream *s, struct proc *p, uint64_t off_out, uint64_t off_err) {
  struct tp_writer w;
  if (frame_begin(s->conn, &w, 64, s->id, TP_STARTED, 0) != 0) return;
  tp_put_u32(&w, TP_T_PID, (uint32_t)p->pid);
  tp_put_u64(&w, TP_T_STDOUT_START, p->out[0].ring.start);
  tp_put_u64(&w, TP_T_STDERR_START, p->out[1].ring.start);
  frame_end(s->conn, &w);
  struct proc_sub *sub = proc_subscribe(p, s, off_out, off_err);
  if (!sub) {
    answer_error(s, CODE_REQUEST_FAILED, ENOMEM, "out of memory");
    return;
  }
  s->state = sub;
  s->on_close = exec_stream_closed;
  s->on_writable = exec_stream_writable;
  proc_sub_pump(sub);
}

void exec_attach_pid(struct stream *s, uint32_t pid, uint64_t off_out, uint64_t off_err) {
  struct proc *p = proc_find((pid_t)pid);
  if (!p || pid == 0) {
    answer_error(s, CODE_PROCESS_NOT_FOUND, 0, "no such process in the agent's table");
    return;
  }
  if (off_out < p->out[0].ring.start || off_err < p->out[1].ring.start) {
    char msg[160];
    snprintf(msg, sizeof msg, "output before offset %llu (stdout) / %llu (stderr) is no longer kept",
             (unsigned long long)p->out[0].ring.start, (unsigned long long)p->out[1].ring.start);
    answer_error(s, CODE_OUTPUT_LOST, 0, msg);
    return;
  }
  start_streaming(s, p, off_out, off_err);
}

void handle_attach(struct stream *s, const struct frame *f) {
  struct tp_reader r;
  struct tp_field fl;
  uint32_t pid = 0;
  uint64_t off = 0, off2 = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_) {
    if (fl.tag == TP_T_PID) tp_field_u32(&fl, &pid);
    if (fl.tag == TP_T_OFFSET) tp_field_u64(&fl, &off);
    if (fl.tag == TP_T_OFFSET2) tp_field_u64(&fl, &off2);
  }
  exec_attach_pid(s, pid, off, off2);
}

void handle_exec(struct stream *s, const struct frame *f) {
  struct exec_req q;
  memset(&q, 0, sizeof q);
  if (parse_exec(s, f, &q) != 0) {
    exec_req_free(&q);
    return;
  }
  struct spawn_spec sp;
  memset(&sp, 0, sizeof sp);
  struct strv owned_env = {0};
  char buf[4200];
  /* Neither user nor uid asked: the default user (users.h), when the agent has one. */
  const char *by_name = q.user ? q.user : q.has_uid ? NULL : users_default();
  const char *home = NULL;
  if (by_name || q.has_uid) {
    struct passwd *pw = by_name ? getpwnam(by_name) : getpwuid(q.uid);
    if (by_name && !pw) {
      snprintf(buf, sizeof buf, "unknown user %s (not in /etc/passwd)", by_name);
      answer_error(s, CODE_INVALID_ARGUMENT, 0, buf);
      exec_req_free(&q);
      return;
    }
    struct stat st;
    if (pw && pw->pw_dir && stat(pw->pw_dir, &st) == 0 && S_ISDIR(st.st_mode)) home = strdup(pw->pw_dir);
    sp.uid = pw ? pw->pw_uid : q.uid;
    /* No passwd entry for a bare uid: its group is the same number, and no others. */
    sp.gid = q.has_gid ? q.gid : pw ? pw->pw_gid : q.uid;
    sp.user_name = NULL;
    if (pw) {
      sp.user_name = strdup(pw->pw_name);
      static const char *const keys[] = {"HOME=", "USER=", "LOGNAME="};
      for (int i = 0; i < 3; i++) {
        snprintf(buf, sizeof buf, "%s%s", keys[i], i == 0 ? pw->pw_dir : pw->pw_name);
        char *e = strdup(buf);
        /* A NULL pushed here would end the vector early; out of memory, leave the key out. */
        if (e && strv_push(&owned_env, e) != 0) free(e);
      }
      if (!sp.user_name) {
        free((char *)home);
        answer_error(s, CODE_REQUEST_FAILED, ENOMEM, "out of memory");
        strv_free(&owned_env);
        exec_req_free(&q);
        return;
      }
    }
    /* Unprivileged (host tests): switching to oneself needs no setgroups. */
    sp.switch_user = getuid() == 0 || sp.uid != getuid() || sp.gid != getgid();
  } else if (q.has_gid) {
    sp.uid = getuid();
    sp.gid = q.gid;
    sp.switch_user = getuid() == 0 || sp.gid != getgid();
  }
  char *shell_argv[4] = {NULL, NULL, NULL, NULL};
  if (q.shell) {
    int bash = access("/bin/bash", X_OK) == 0;
    shell_argv[0] = bash ? "/bin/bash" : "/bin/sh";
    shell_argv[1] = bash ? "-lc" : "-c";
    shell_argv[2] = q.shell;
    sp.argv = shell_argv;
  } else {
    sp.argv = q.args.v;
  }
  sp.envp = build_env(q.env.v, &owned_env, q.has_pty);
  /* No cwd asked: the user's home (as E2B), else the agent's own working directory. */
  if (!(q.cwd && *q.cwd) && home) {
    free(q.cwd);
    q.cwd = (char *)home; /* PROC_LIST shows where it runs */
    home = NULL;
  }
  sp.cwd = q.cwd && *q.cwd ? q.cwd : NULL;
  sp.pty = q.has_pty;
  sp.rows = q.rows;
  sp.cols = q.cols;
  sp.want_stdin = q.want_stdin;
  struct spawn_result res;
  int rc = sp.envp ? spawn_process(&sp, &res) : (res.err = ENOMEM, res.stage = "env", -1);
  free(sp.envp);
  free((char *)sp.user_name);
  free((char *)home);
  strv_free(&owned_env);
  if (rc != 0) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s failed: %s", res.stage, strerror(res.err));
    answer_errno(s, res.err, msg);
    exec_req_free(&q);
    return;
  }
  struct proc *p = proc_add(&res, q.has_pty, q.timeout_ms, strv_take(&q.args), q.shell, q.cwd, q.tag,
                            strv_take(&q.env));
  q.shell = q.cwd = q.tag = NULL;
  exec_req_free(&q);
  if (!p) {
    /* Nobody could ever read, signal or reap-report it: stop it and give back its fds. */
    kill(-res.pid, SIGKILL);
    kill(res.pid, SIGKILL);
    if (res.out_fd >= 0) close(res.out_fd);
    if (res.err_fd >= 0) close(res.err_fd);
    if (res.in_fd >= 0) close(res.in_fd);
    answer_error(s, CODE_REQUEST_FAILED, ENOMEM, "out of memory");
    return;
  }
  if (s->remember) {
    reqid_set_exec(s->request_id, p->pid);
    s->remember = 0;
  }
  start_streaming(s, p, 0, 0);
}

static struct proc *find_live(struct stream *s, uint32_t pid) {
  struct proc *p = pid ? proc_find((pid_t)pid) : NULL;
  if (!p || p->finished) {
    answer_error(s, CODE_PROCESS_NOT_FOUND, 0, p ? "the process has ended" : "no such process in the agent's table");
    return NULL;
  }
  return p;
}

void handle_stdin(struct stream *s, const struct frame *f) {
  struct tp_reader r;
  struct tp_field fl;
  uint32_t pid = 0;
  const uint8_t *data = NULL;
  size_t len = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_) {
    if (fl.tag == TP_T_PID) tp_field_u32(&fl, &pid);
    if (fl.tag == TP_T_DATA) {
      data = fl.value;
      len = fl.len;
    }
  }
  if ((int64_t)len > s->recv_window) {
    conn_goaway(s->conn, CODE_PROTOCOL_ERROR, "STDIN data beyond the stream's window");
    return;
  }
  struct proc *p = find_live(s, pid);
  if (!p) return;
  int err = proc_stdin_enqueue(p, s, data ? data : (const uint8_t *)"", len, (f->h.flags & TP_FLAG_END) != 0);
  if (err) answer_errno(s, err, err == EPIPE ? "the process's stdin is not open (exec with stdin: true)" : "stdin queue full");
}

void handle_proc_signal(struct stream *s, const struct frame *f) {
  struct tp_reader r;
  struct tp_field fl;
  uint32_t pid = 0, sig = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_) {
    if (fl.tag == TP_T_PID) tp_field_u32(&fl, &pid);
    if (fl.tag == TP_T_SIGNAL) tp_field_u32(&fl, &sig);
  }
  if (sig == 0 || sig >= 65) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "signal must be 1..64");
    return;
  }
  struct proc *p = find_live(s, pid);
  if (!p) return;
  /* The whole group; the leader alone when it left its group (never a reaped pid: it
   * may belong to someone else by now). An empty group of a reaped leader is fine. */
  if (kill(-p->pid, (int)sig) != 0 && !p->reaped && kill(p->pid, (int)sig) != 0) {
    answer_errno(s, errno, "kill failed");
    return;
  }
  answer_ok(s);
}

void handle_pty_resize(struct stream *s, const struct frame *f) {
  struct tp_reader r;
  struct tp_field fl;
  uint32_t pid = 0, rows = 0, cols = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_) {
    if (fl.tag == TP_T_PID) tp_field_u32(&fl, &pid);
    if (fl.tag == TP_T_PTY_ROWS) tp_field_u32(&fl, &rows);
    if (fl.tag == TP_T_PTY_COLS) tp_field_u32(&fl, &cols);
  }
  if (rows == 0 || cols == 0 || rows > 0xffff || cols > 0xffff) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "pty_rows and pty_cols must be 1..65535");
    return;
  }
  struct proc *p = find_live(s, pid);
  if (!p) return;
  int fd = p->stdin_fd >= 0 ? p->stdin_fd : p->out[0].open ? p->out[0].w.fd : -1;
  if (!p->is_pty || fd < 0) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "the process has no pty");
    return;
  }
  if (pty_resize(fd, rows, cols) != 0) {
    answer_errno(s, errno, "TIOCSWINSZ failed");
    return;
  }
  answer_ok(s);
}

/* A process's argv, shell and env in a listing: at most this many bytes of them per entry
 * (a command may carry about 2 MiB of them; a listing is one frame). Past it the rest of
 * the strings are left out of that entry. */
#define LIST_ENTRY_STRINGS_MAX (64u * 1024u)

/* Puts (w non-NULL) or measures the entry's argv, shell and env fields within the budget. */
static size_t entry_strings(struct tp_writer *w, const struct proc *p) {
  size_t used = 0;
  int full = 0;
  char *shell_only[2] = {p->shell, NULL};
  char **lists[3] = {p->argv, shell_only, p->env};
  const uint16_t tags[3] = {TP_T_ARG, TP_T_SHELL, TP_T_ENV};
  for (int i = 0; i < 3 && !full; i++) {
    for (char **a = lists[i]; a && *a; a++) {
      size_t n = TP_FIELD_HEADER_SIZE + strlen(*a);
      if (used + n > LIST_ENTRY_STRINGS_MAX) {
        full = 1;
        break;
      }
      used += n;
      if (w) tp_put_str(w, tags[i], *a);
    }
  }
  return used;
}

static size_t entry_bytes(const struct proc *p) {
  size_t n = TP_FIELD_HEADER_SIZE;                                 /* entry */
  n += 4 * (TP_FIELD_HEADER_SIZE + 4) + TP_FIELD_HEADER_SIZE + 1; /* pid, exit_code, ..., running */
  n += entry_strings(NULL, p);
  n += TP_FIELD_HEADER_SIZE + (p->cwd ? strlen(p->cwd) : 0);
  n += TP_FIELD_HEADER_SIZE + (p->tag ? strlen(p->tag) : 0);
  return n;
}

void handle_proc_list(struct stream *s, const struct frame *f) {
  (void)f;
  /* Newest first; stops before an entry that would not fit one frame. */
  size_t total = 0;
  for (struct proc *p = proc_first(); p; p = p->next) {
    size_t e = entry_bytes(p);
    if (total + e > TP_MAX_PAYLOAD) break;
    total += e;
  }
  struct tp_writer w;
  if (answer_begin(s, &w, total, TP_OK) != 0) return;
  size_t used = 0;
  for (struct proc *p = proc_first(); p; p = p->next) {
    size_t e = entry_bytes(p);
    if (used + e > total) break;
    used += e;
    size_t mark = tp_put_begin(&w, TP_T_ENTRY);
    tp_put_u32(&w, TP_T_PID, (uint32_t)p->pid);
    entry_strings(&w, p);
    tp_put_str(&w, TP_T_PATH, p->cwd ? p->cwd : "");
    tp_put_str(&w, TP_T_TAG, p->tag ? p->tag : "");
    tp_put_bool(&w, TP_T_RUNNING, !p->finished);
    if (p->finished) tp_put_i32(&w, TP_T_EXIT_CODE, proc_exit_code(p));
    tp_put_end(&w, mark);
  }
  answer_end(s, &w);
}
