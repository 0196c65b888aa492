/* FILE_READ, FILE_WRITE, FILE_LIST, FILE_STAT, MKDIR, REMOVE, RENAME.
 * File I/O is done synchronously in the event loop: guest-local disk, bounded chunks. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errors.h"
#include "handlers.h"
#include "users.h"

#define READ_CHUNK (128u * 1024u)
#define LIST_MAX_DEPTH 16u
#define REMOVE_MAX_DEPTH 256

/* Makes *p absolute against the user's home when it is relative (users.h): 0 or -1. */
static int resolve_path(const struct user_ctx *u, char **p) {
  if (!*p || (*p)[0] == '/') return 0;
  char *abs = users_path(u, *p);
  if (!abs) return -1;
  free(*p);
  *p = abs;
  return 0;
}

/* The request's user (`user`, else the default), path (and path2), checked; relative
 * paths resolved against the user's home. 0, or -1 after answering. */
static int request_paths(struct stream *s, const struct frame *f, char **path, char **path2, struct user_ctx *u) {
  struct tp_reader r;
  struct tp_field fl;
  char *user = NULL;
  int bad = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_ && !bad) {
    if (fl.tag == TP_T_PATH) bad = field_cstr(&fl, path) != 0;
    if (fl.tag == TP_T_PATH2 && path2) bad = field_cstr(&fl, path2) != 0;
    if (fl.tag == TP_T_USER) bad = field_cstr(&fl, &user) != 0;
  }
  if (bad) {
    free(user);
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "path or user holds a NUL byte");
    return -1;
  }
  if (!*path || !**path || (path2 && (!*path2 || !**path2))) {
    free(user);
    answer_error(s, CODE_INVALID_ARGUMENT, 0, path2 ? "path and path2 are required" : "path is required");
    return -1;
  }
  if (users_resolve(user, u) != 0) {
    char msg[400];
    snprintf(msg, sizeof msg, "unknown user %.256s (not in /etc/passwd)", user ? user : users_default());
    free(user);
    answer_error(s, CODE_INVALID_ARGUMENT, 0, msg);
    return -1;
  }
  free(user);
  if (resolve_path(u, path) != 0 || (path2 && resolve_path(u, path2) != 0)) {
    answer_error(s, CODE_REQUEST_FAILED, ENOMEM, "out of memory");
    return -1;
  }
  users_cache_reset();
  return 0;
}

static int u32_field(const struct frame *f, uint16_t tag, uint32_t *out) {
  struct tp_reader r;
  struct tp_field fl;
  int found = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_)
    if (fl.tag == tag) found = tp_field_u32(&fl, out) == TP_OK_;
  return found;
}

static int bool_field(const struct frame *f, uint16_t tag) {
  struct tp_reader r;
  struct tp_field fl;
  int v = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_)
    if (fl.tag == tag) tp_field_bool(&fl, &v);
  return v;
}

static void answer_path_errno(struct stream *s, int err, const char *op, const char *path) {
  char msg[4200];
  snprintf(msg, sizeof msg, "%s %s: %s", op, path, strerror(err));
  answer_errno(s, err, msg);
}

/* ---- entries (FILE_LIST, FILE_STAT) ---- */

static const char *type_name(mode_t m) {
  if (S_ISREG(m)) return "file";
  if (S_ISDIR(m)) return "dir";
  if (S_ISLNK(m)) return "symlink";
  return "other";
}

/* Upper bound of one entry's bytes. */
#define ENTRY_MAX (TP_FIELD_HEADER_SIZE + 2 * (TP_FIELD_HEADER_SIZE + TP_MAX_PATH) + 2 * (TP_FIELD_HEADER_SIZE + 256) + 200)

/* Writes one entry field for path (lstat'ed as st; dirfd/name to read a link target). */
static void put_entry(struct tp_writer *w, const char *path, const struct stat *st, int dirfd, const char *name) {
  size_t mark = tp_put_begin(w, TP_T_ENTRY);
  tp_put_str(w, TP_T_PATH, path);
  tp_put_str(w, TP_T_TYPE, type_name(st->st_mode));
  tp_put_u64(w, TP_T_SIZE, (uint64_t)st->st_size);
  tp_put_u32(w, TP_T_MODE, (uint32_t)(st->st_mode & 0177777)); /* type and permission bits, as st_mode */
  tp_put_i64(w, TP_T_MTIME_NS, (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec);
  if (S_ISLNK(st->st_mode)) {
    char target[TP_MAX_PATH];
    ssize_t n = readlinkat(dirfd, name, target, sizeof target);
    if (n >= 0) tp_put_bytes(w, TP_T_TARGET, target, (size_t)n);
  }
  tp_put_u32(w, TP_T_UID_OUT, (uint32_t)st->st_uid);
  tp_put_u32(w, TP_T_GID_OUT, (uint32_t)st->st_gid);
  const char *owner = users_uid_name(st->st_uid), *group = users_gid_name(st->st_gid);
  if (owner) tp_put_str(w, TP_T_OWNER, owner);
  if (group) tp_put_str(w, TP_T_GROUP, group);
  tp_put_end(w, mark);
}

struct lister {
  struct bytebuf out; /* encoded entry fields */
  int too_big;
  int err;
};

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Lists dir (already open as dfd) into l, depth levels deep, sorted by name. */
static void list_dir(struct lister *l, int dfd, const char *dirpath, unsigned depth) {
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      char **nn = realloc(names, cap * sizeof *nn);
      if (!nn) break;
      names = nn;
    }
    if (!(names[n] = strdup(de->d_name))) break;
    n++;
  }
  if (n > 1) qsort(names, n, sizeof *names, cmp_names); /* names is NULL for an empty directory */
  static uint8_t scratch[ENTRY_MAX];
  for (size_t i = 0; i < n && !l->too_big; i++) {
    char path[TP_MAX_PATH + 1];
    int len = snprintf(path, sizeof path, "%s%s%s", dirpath, dirpath[strlen(dirpath) - 1] == '/' ? "" : "/", names[i]);
    struct stat st;
    if (len < 0 || (size_t)len > TP_MAX_PATH || fstatat(dirfd(d), names[i], &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    struct tp_writer w;
    tp_writer_init(&w, scratch, sizeof scratch);
    put_entry(&w, path, &st, dirfd(d), names[i]);
    if (w.overflow) continue;
    if (bytebuf_pending(&l->out) + w.len > TP_MAX_PAYLOAD) {
      l->too_big = 1;
      break;
    }
    uint8_t *dst = bytebuf_reserve(&l->out, w.len);
    if (!dst) {
      l->err = ENOMEM;
      break;
    }
    memcpy(dst, scratch, w.len);
    l->out.len += w.len;
    if (S_ISDIR(st.st_mode) && depth > 1) {
      int sub = openat(dirfd(d), names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0) list_dir(l, sub, path, depth - 1);
    }
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  closedir(d);
}

void handle_file_list(struct stream *s, const struct frame *f) {
  char *path = NULL;
  struct user_ctx u;
  if (request_paths(s, f, &path, NULL, &u) != 0) goto out;
  uint32_t depth = 1;
  u32_field(f, TP_T_DEPTH, &depth);
  if (depth == 0) depth = 1;
  if (depth > LIST_MAX_DEPTH) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "depth is at most 16");
    goto out;
  }
  int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    answer_path_errno(s, errno, "list", path);
    goto out;
  }
  struct lister l;
  memset(&l, 0, sizeof l);
  list_dir(&l, dfd, path, depth);
  if (l.too_big || l.err) {
    answer_error(s, l.err ? CODE_REQUEST_FAILED : CODE_INVALID_ARGUMENT, l.err ? l.err : E2BIG,
                 "the listing exceeds one 1 MiB frame: list with a smaller depth");
  } else {
    struct tp_writer w;
    size_t n = bytebuf_pending(&l.out);
    if (answer_begin(s, &w, n, TP_OK) == 0) {
      if (n) memcpy(w.buf + w.len, l.out.p + l.out.off, n);
      w.len += n;
      answer_end(s, &w);
    }
  }
  bytebuf_free(&l.out);
out:
  free(path);
}

void handle_file_stat(struct stream *s, const struct frame *f) {
  char *path = NULL;
  struct stat st;
  struct user_ctx u;
  if (request_paths(s, f, &path, NULL, &u) != 0) goto out;
  /* `follow`: the final symlink's target (what exists() asks); else the link itself. */
  if ((bool_field(f, TP_T_FOLLOW) ? stat(path, &st) : lstat(path, &st)) != 0) {
    answer_path_errno(s, errno, "stat", path);
    goto out;
  }
  struct tp_writer w;
  if (answer_begin(s, &w, ENTRY_MAX, TP_OK) != 0) goto out;
  put_entry(&w, path, &st, AT_FDCWD, path);
  answer_end(s, &w);
out:
  free(path);
}

/* ---- MKDIR, REMOVE, RENAME ---- */

/* Creates one directory, owned by u (when set). With exist_ok an existing directory is
 * fine, but an existing non-directory fails with ENOTDIR: "exists and is not a directory". */
static int mkdir_one(const char *path, mode_t mode, int exist_ok, const struct user_ctx *u) {
  if (mkdir(path, mode) == 0) {
    users_chown_path(u, path);
    return chmod(path, mode); /* the exact mode, whatever the umask */
  }
  if (errno == EEXIST && exist_ok) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
    errno = ENOTDIR;
  }
  return -1;
}

/* mkdir -p of every ancestor of path (0755, owned by u; existing directories are fine):
 * 0, or -1 with errno. path is restored before returning. */
static int mkdir_ancestors(char *path, const struct user_ctx *u) {
  for (char *p = path + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    int rc = mkdir_one(path, 0755, 1, u);
    int e = errno;
    *p = '/';
    if (rc != 0) {
      errno = e;
      return -1;
    }
  }
  return 0;
}

void handle_mkdir(struct stream *s, const struct frame *f) {
  char *path = NULL;
  struct user_ctx u;
  if (request_paths(s, f, &path, NULL, &u) != 0) goto out;
  uint32_t mode = 0755;
  u32_field(f, TP_T_MODE, &mode);
  mode &= 07777;
  int parents = bool_field(f, TP_T_RECURSIVE);
  if ((parents && mkdir_ancestors(path, &u) != 0) || mkdir_one(path, mode, parents, &u) != 0) {
    int e = errno;
    if (e == ENOTDIR) {
      char msg[4200];
      snprintf(msg, sizeof msg, "mkdir %s: it, or a directory on its way, exists and is not a directory", path);
      answer_errno(s, e, msg);
    } else {
      answer_path_errno(s, e, "mkdir", path);
    }
    goto out;
  }
  answer_ok(s);
out:
  free(path);
}

/* Removes everything below dfd (not following symlinks: a link is removed, never its
 * target), then closes dfd. */
static int remove_below(int dfd, int level) {
  if (level > REMOVE_MAX_DEPTH) {
    close(dfd);
    errno = ELOOP;
    return -1;
  }
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return -1;
  }
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
    if (unlinkat(dirfd(d), de->d_name, 0) == 0) continue;
    if (errno != EISDIR && errno != EPERM) {
      rc = -1;
      break;
    }
    int sub = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0 || remove_below(sub, level + 1) != 0 || unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) != 0) {
      rc = -1;
      break;
    }
  }
  int e = errno;
  closedir(d);
  errno = e;
  return rc;
}

void handle_remove(struct stream *s, const struct frame *f) {
  char *path = NULL;
  struct stat st;
  struct user_ctx u;
  if (request_paths(s, f, &path, NULL, &u) != 0) goto out;
  if (!strcmp(path, "/")) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, "refusing to remove /");
    goto out;
  }
  if (lstat(path, &st) != 0) {
    answer_path_errno(s, errno, "remove", path);
    goto out;
  }
  int rc;
  if (S_ISDIR(st.st_mode)) {
    if (bool_field(f, TP_T_RECURSIVE)) {
      int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      rc = dfd < 0 ? -1 : remove_below(dfd, 0);
      if (rc == 0) rc = rmdir(path);
    } else {
      rc = rmdir(path);
    }
  } else {
    rc = unlink(path);
  }
  if (rc != 0) {
    answer_path_errno(s, errno, "remove", path);
    goto out;
  }
  answer_ok(s);
out:
  free(path);
}

void handle_rename(struct stream *s, const struct frame *f) {
  char *path = NULL, *path2 = NULL;
  struct user_ctx u;
  struct stat st;
  if (request_paths(s, f, &path, &path2, &u) != 0) goto out;
  if (lstat(path, &st) != 0) {
    answer_path_errno(s, errno, "rename: source", path);
    goto out;
  }
  int rc = rename(path, path2);
  /* The source exists, so ENOENT is the destination's directory: create it (as E2B). */
  if (rc != 0 && errno == ENOENT) rc = mkdir_ancestors(path2, &u) == 0 ? rename(path, path2) : -1;
  if (rc != 0) {
    int e = errno;
    char msg[8400];
    snprintf(msg, sizeof msg, "rename %s to %s: %s", path, path2, strerror(e));
    answer_errno(s, e, msg);
    goto out;
  }
  answer_ok(s);
out:
  free(path);
  free(path2);
}

/* ---- FILE_READ ---- */

struct file_read {
  int fd;
  int known_size; /* a regular file: send exactly size bytes */
  uint64_t size, sent;
};

static void read_closed(struct stream *s) {
  struct file_read *fr = s->state;
  if (!fr) return;
  close(fr->fd);
  free(fr);
  s->state = NULL;
}

static void read_pump(struct stream *s) {
  struct file_read *fr = s->state;
  struct conn *c = s->conn;
  while (fr && s->send_window > 0 && !conn_backlogged(c)) {
    size_t want = READ_CHUNK;
    if ((uint64_t)want > (uint64_t)s->send_window) want = (size_t)s->send_window;
    if (fr->known_size && fr->size - fr->sent < want) want = (size_t)(fr->size - fr->sent);
    struct tp_writer w;
    if (frame_begin(c, &w, TP_FIELD_HEADER_SIZE + want, s->id, TP_DATA, 0) != 0) return;
    uint8_t *field = w.buf + w.len;
    ssize_t n;
    do n = want ? read(fr->fd, field + TP_FIELD_HEADER_SIZE, want) : 0;
    while (n < 0 && errno == EINTR);
    if (n < 0 && errno != EAGAIN) {
      int e = errno;
      w.overflow = 1; /* abandon the DATA frame: nothing was committed */
      answer_path_errno(s, e, "read", "file");
      return;
    }
    if (n < 0) n = 0;
    fr->sent += (uint64_t)n;
    int last = n == 0 || (fr->known_size && fr->sent >= fr->size);
    tp_put16(field, TP_T_DATA);
    tp_put32(field + 2, (uint32_t)n);
    w.len += TP_FIELD_HEADER_SIZE + (size_t)n;
    s->send_window -= n;
    if (last) {
      tp_put16(w.buf + w.frame_start + 10, TP_FLAG_END);
      frame_end(c, &w);
      stream_close(s); /* not remembered: a read runs again when asked again */
      return;
    }
    frame_end(c, &w);
  }
}

void handle_file_read(struct stream *s, const struct frame *f) {
  char *path = NULL;
  struct user_ctx u;
  if (request_paths(s, f, &path, NULL, &u) != 0) goto out;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    answer_path_errno(s, errno, "open", path);
    if (fd >= 0) close(fd);
    goto out;
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    answer_path_errno(s, EISDIR, "read", path);
    goto out;
  }
  struct file_read *fr = calloc(1, sizeof *fr);
  if (!fr) {
    close(fd);
    answer_error(s, CODE_REQUEST_FAILED, ENOMEM, "out of memory");
    goto out;
  }
  fr->fd = fd;
  fr->size = (uint64_t)st.st_size;
  /* /proc and /sys files claim size 0 yet have content: read those until EOF. */
  fr->known_size = S_ISREG(st.st_mode) && st.st_size > 0;
  if (S_ISREG(st.st_mode)) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  char probe;
  int empty = S_ISREG(st.st_mode) && st.st_size == 0 && pread(fd, &probe, 1, 0) == 0;
  struct tp_writer w;
  if (frame_begin(s->conn, &w, 16, s->id, TP_OK, empty ? TP_FLAG_END : 0) != 0) {
    close(fd);
    free(fr);
    goto out;
  }
  tp_put_u64(&w, TP_T_SIZE, fr->size);
  frame_end(s->conn, &w);
  if (empty) {
    close(fd);
    free(fr);
    stream_close(s);
    goto out;
  }
  s->state = fr;
  s->on_close = read_closed;
  s->on_writable = read_pump;
  read_pump(s);
out:
  free(path);
}

/* ---- FILE_WRITE ---- */

struct file_write {
  int fd;
  char *tmp;   /* the temporary file next to the target */
  char *path;  /* the target */
  uint32_t mode;
  uint64_t size;
};

static void write_closed(struct stream *s) {
  struct file_write *fw = s->state;
  if (!fw) return;
  if (fw->fd >= 0) {
    close(fw->fd);
    unlink(fw->tmp); /* abandoned: leave nothing half-written behind */
  }
  free(fw->tmp);
  free(fw->path);
  free(fw);
  s->state = NULL;
}

static void write_fail(struct stream *s, int err, const char *op) {
  struct file_write *fw = s->state;
  char msg[4200];
  snprintf(msg, sizeof msg, "%s %s: %s", op, fw->path, strerror(err));
  answer_errno(s, err, msg); /* closes the stream: write_closed removes the temp file */
}

static void write_finish(struct stream *s) {
  struct file_write *fw = s->state;
  if (fchmod(fw->fd, fw->mode) != 0) { write_fail(s, errno, "chmod"); return; }
  if (fsync(fw->fd) != 0) { write_fail(s, errno, "fsync"); return; }
  if (rename(fw->tmp, fw->path) != 0) { write_fail(s, errno, "rename onto"); return; }
  close(fw->fd);
  fw->fd = -1;
  /* The rename itself is durable only once the directory is synced. */
  char *slash = strrchr(fw->path, '/');
  char dir[TP_MAX_PATH + 1];
  if (slash == fw->path)
    strcpy(dir, "/");
  else if (slash)
    snprintf(dir, sizeof dir, "%.*s", (int)(slash - fw->path), fw->path);
  else
    strcpy(dir, ".");
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  struct tp_writer w;
  if (answer_begin(s, &w, 16, TP_OK) != 0) return;
  tp_put_u64(&w, TP_T_SIZE, fw->size);
  answer_end(s, &w);
}

static void write_frame(struct stream *s, const struct frame *f) {
  struct file_write *fw = s->state;
  if (f->h.type != TP_DATA) {
    answer_error(s, CODE_PROTOCOL_ERROR, 0, "FILE_WRITE expects DATA frames");
    return;
  }
  const uint8_t *data;
  size_t len;
  frame_find_bytes(f, TP_T_DATA, &data, &len);
  if ((int64_t)len > s->recv_window) {
    conn_goaway(s->conn, CODE_PROTOCOL_ERROR, "DATA beyond the stream's window");
    return;
  }
  for (size_t done = 0; done < len;) {
    ssize_t n = write(fw->fd, data + done, len - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) { write_fail(s, n < 0 ? errno : EIO, "write"); return; }
    done += (size_t)n;
  }
  fw->size += len;
  if (f->h.flags & TP_FLAG_END) {
    write_finish(s);
    return;
  }
  if (len) {
    /* Written already: hand the window back at once. */
    struct tp_writer w;
    if (frame_begin(s->conn, &w, 16, s->id, TP_CREDIT, 0) != 0) return;
    tp_put_u32(&w, TP_T_CREDIT, (uint32_t)len);
    frame_end(s->conn, &w);
  }
}

void handle_file_write(struct stream *s, const struct frame *f) {
  char *path = NULL;
  struct user_ctx u;
  if (request_paths(s, f, &path, NULL, &u) != 0) {
    free(path);
    return;
  }
  uint32_t mode = 0644;
  /* No mode asked and the file exists: the new content keeps its mode and owner, as an
   * in-place write would (the temporary file replaces the old inode). */
  struct stat old;
  int replacing = lstat(path, &old) == 0 && S_ISREG(old.st_mode);
  if (!u32_field(f, TP_T_MODE, &mode) && replacing) mode = old.st_mode & 07777;
  struct file_write *fw = calloc(1, sizeof *fw);
  size_t tlen = strlen(path) + 32;
  char *tmp = malloc(tlen);
  if (!fw || !tmp) {
    free(fw);
    free(tmp);
    free(path);
    answer_error(s, CODE_REQUEST_FAILED, ENOMEM, "out of memory");
    return;
  }
  /* ".name.torpor-XXXXXXXX" in the target's directory, so the rename is atomic. */
  char *slash = strrchr(path, '/');
  size_t dirlen = slash ? (size_t)(slash - path) + 1 : 0;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; attempt++) {
    unsigned rnd = (unsigned)(now_ms() * 2654435761u) ^ (unsigned)getpid() ^ (unsigned)(attempt * 7919);
    snprintf(tmp, tlen, "%.*s.%s.torpor-%08x", (int)dirlen, path, path + dirlen, rnd);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    /* A missing directory on the way: create the parents (0755), as `mkdir -p`, once. */
    if (fd < 0 && errno == ENOENT && attempt == 0 && dirlen > 1) {
      if (mkdir_ancestors(path, &u) != 0) break;
      fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    }
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    int e = errno;
    char msg[4200];
    snprintf(msg, sizeof msg, "create a temporary file next to %s: %s", path, strerror(e));
    answer_errno(s, e, msg);
    free(fw);
    free(tmp);
    free(path);
    return;
  }
  if (replacing && geteuid() == 0) {
    if (fchown(fd, old.st_uid, old.st_gid) != 0) { /* best effort, as users_chown_fd */
    }
  } else {
    users_chown_fd(&u, fd); /* a new file is the user's, as a file the user wrote */
  }
  fw->fd = fd;
  fw->tmp = tmp;
  fw->path = path;
  fw->mode = mode & 07777;
  s->state = fw;
  s->on_close = write_closed;
  s->on_frame = write_frame;
  if (f->h.flags & TP_FLAG_END) write_finish(s); /* no DATA to come: an empty file */
}
