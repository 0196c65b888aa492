#include "identity.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IDENTITY_FILE_MAX (256 * 1024) /* an /etc/hosts this large is not ours to rewrite */

int identity_valid_hostname(const char *h) {
  size_t n = strlen(h);
  if (n < 1 || n > 63 || h[0] == '-' || h[n - 1] == '-') return 0;
  for (size_t i = 0; i < n; i++) {
    char c = h[i];
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return 0;
  }
  return 1;
}

int identity_valid_machine_id(const char *id) {
  int nonzero = 0;
  if (strlen(id) != 32) return 0;
  for (size_t i = 0; i < 32; i++) {
    char c = id[i];
    if (!((c >= 'a' && c <= 'f') || (c >= '0' && c <= '9'))) return 0;
    if (c != '0') nonzero = 1;
  }
  return nonzero;
}

int identity_valid_mac(const uint8_t mac[6]) {
  static const uint8_t zero[6];
  return !(mac[0] & 1) && memcmp(mac, zero, 6) != 0;
}

/* Whether the line [p, p+n) maps 127.0.1.1 (its first field). */
static int is_loopback_name_line(const char *p, size_t n) {
  static const char addr[] = "127.0.1.1";
  const size_t alen = sizeof(addr) - 1;
  while (n && (*p == ' ' || *p == '\t')) p++, n--;
  return n > alen && memcmp(p, addr, alen) == 0 && (p[alen] == ' ' || p[alen] == '\t');
}

char *identity_hosts_text(const char *old, size_t len, const char *hostname, size_t *out_len) {
  char line[96];
  int ln = snprintf(line, sizeof line, "127.0.1.1\t%s\n", hostname);
  if (ln < 0 || (size_t)ln >= sizeof line) return NULL;
  if (!old) {
    static const char head[] = "127.0.0.1\tlocalhost\n";
    static const char tail[] = "::1\tlocalhost ip6-localhost ip6-loopback\n";
    size_t n = sizeof head - 1 + (size_t)ln + sizeof tail - 1;
    char *out = malloc(n + 1);
    if (out) snprintf(out, n + 1, "%s%s%s", head, line, tail);
    *out_len = n;
    return out;
  }
  /* At most: the old text, a newline it lacked at its end, and our line. */
  char *out = malloc(len + 1 + (size_t)ln + 1);
  if (!out) return NULL;
  size_t o = 0;
  int replaced = 0;
  for (size_t i = 0; i < len;) {
    const char *nl = memchr(old + i, '\n', len - i);
    size_t n = nl ? (size_t)(nl - (old + i)) + 1 : len - i;
    if (!replaced && is_loopback_name_line(old + i, n)) {
      memcpy(out + o, line, (size_t)ln);
      o += (size_t)ln;
      replaced = 1;
    } else {
      memcpy(out + o, old + i, n);
      o += n;
      if (!nl) out[o++] = '\n';
    }
    i += n;
  }
  if (!replaced) {
    memcpy(out + o, line, (size_t)ln);
    o += (size_t)ln;
  }
  out[o] = 0;
  *out_len = o;
  return out;
}

/* The whole of a regular file (NUL after its *len bytes). NULL with errno: ENOENT missing,
 * EINVAL not a regular file (a symlink, a FIFO, a device: never opened for reading, so the
 * agent cannot block on it), EFBIG IDENTITY_FILE_MAX or more, else the read's. */
static char *read_regular(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ELOOP) errno = EINVAL;
    return NULL;
  }
  struct stat st;
  int err = 0;
  char *buf = NULL;
  size_t n = 0;
  if (fstat(fd, &st) != 0)
    err = errno;
  else if (!S_ISREG(st.st_mode))
    err = EINVAL;
  else if (st.st_size >= IDENTITY_FILE_MAX)
    err = EFBIG;
  else if (!(buf = malloc(IDENTITY_FILE_MAX + 1)))
    err = ENOMEM;
  while (!err && n < IDENTITY_FILE_MAX) {
    ssize_t r = read(fd, buf + n, IDENTITY_FILE_MAX - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) err = errno;
    if (r <= 0) break;
    n += (size_t)r;
  }
  if (!err && n == IDENTITY_FILE_MAX) err = EFBIG; /* grew while read */
  close(fd);
  if (err) {
    free(buf);
    errno = err;
    return NULL;
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

/* Replaces path with text (len bytes) by rename, unless it holds exactly that already; a path
 * that is there but not a regular file is left alone (EINVAL). 0 or an errno. */
static int replace_file(const char *path, const char *text, size_t len, mode_t mode) {
  size_t have_len = 0;
  char *have = read_regular(path, &have_len);
  if (!have && errno != ENOENT) return errno;
  int same = have && have_len == len && memcmp(have, text, len) == 0;
  free(have);
  if (same) return 0;
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.torpor-new", path) >= (int)sizeof tmp) return ENAMETOOLONG;
  unlink(tmp); /* one a crash left */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return errno;
  int err = 0;
  for (size_t off = 0; off < len && !err;) {
    ssize_t w = write(fd, text + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) err = errno;
    else off += (size_t)w;
  }
  if (!err && fchmod(fd, mode) != 0) err = errno; /* past the umask */
  if (close(fd) != 0 && !err) err = errno;
  if (!err && rename(tmp, path) != 0) err = errno;
  if (err) unlink(tmp);
  return err;
}

/* Counts a file left as it was; the first one's reason goes into note. */
static void left_alone(int *count, char *note, size_t size, const char *file, int err) {
  if ((*count)++ == 0) snprintf(note, size, "%s left as it was: %s", file, strerror(err));
}

int identity_write_files(const char *root, const char *hostname, const char *machine_id, char *note, size_t size) {
  char path[4096];
  char text[128];
  int n = 0, err;
  if (size) note[0] = 0;
  if (hostname) {
    snprintf(path, sizeof path, "%s/etc/hostname", root);
    int tl = snprintf(text, sizeof text, "%s\n", hostname);
    if ((err = replace_file(path, text, (size_t)tl, 0644)) != 0) left_alone(&n, note, size, "/etc/hostname", err);
    snprintf(path, sizeof path, "%s/etc/hosts", root);
    size_t len = 0, hosts_len = 0;
    char *old = read_regular(path, &len);
    if (!old && errno != ENOENT) {
      left_alone(&n, note, size, "/etc/hosts", errno);
    } else {
      char *hosts = identity_hosts_text(old, len, hostname, &hosts_len);
      if (!hosts)
        left_alone(&n, note, size, "/etc/hosts", ENOMEM);
      else if ((err = replace_file(path, hosts, hosts_len, 0644)) != 0)
        left_alone(&n, note, size, "/etc/hosts", err);
      free(hosts);
    }
    free(old);
  }
  if (machine_id) {
    snprintf(path, sizeof path, "%s/etc/machine-id", root);
    int tl = snprintf(text, sizeof text, "%s\n", machine_id);
    if ((err = replace_file(path, text, (size_t)tl, 0444)) != 0) left_alone(&n, note, size, "/etc/machine-id", err);
  }
  return n;
}
