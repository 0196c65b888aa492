#include "identity.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IDENTITY_FILE_MAX (256 * 1024) /* /etc/hosts larger than this is not ours to rewrite */

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

/* Whether the line [p, p+n) maps 127.0.1.1 (its first field). */
static int is_loopback_name_line(const char *p, size_t n) {
  static const char addr[] = "127.0.1.1";
  const size_t alen = sizeof(addr) - 1;
  while (n && (*p == ' ' || *p == '\t')) p++, n--;
  return n > alen && memcmp(p, addr, alen) == 0 && (p[alen] == ' ' || p[alen] == '\t');
}

char *identity_hosts_text(const char *old, size_t len, const char *hostname) {
  char line[96];
  int ln = snprintf(line, sizeof line, "127.0.1.1\t%s\n", hostname);
  if (ln < 0 || (size_t)ln >= sizeof line) return NULL;
  if (!old) {
    static const char head[] = "127.0.0.1\tlocalhost\n";
    static const char tail[] = "::1\tlocalhost ip6-localhost ip6-loopback\n";
    char *out = malloc(sizeof head + (size_t)ln + sizeof tail);
    if (out) snprintf(out, sizeof head + (size_t)ln + sizeof tail, "%s%s%s", head, line, tail);
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
  return out;
}

/* The file's whole text (NUL-terminated, *len bytes), or NULL with errno (ENOENT: missing). */
static char *read_small(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  char *buf = malloc(IDENTITY_FILE_MAX + 1);
  size_t n = 0;
  int err = buf ? 0 : ENOMEM;
  while (!err && n < IDENTITY_FILE_MAX) {
    ssize_t r = read(fd, buf + n, IDENTITY_FILE_MAX - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) err = errno;
    if (r <= 0) break;
    n += (size_t)r;
  }
  if (!err && n == IDENTITY_FILE_MAX) err = EFBIG;
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

/* Replaces path with text by rename, unless it holds text already. */
static int replace_file(const char *path, const char *text, mode_t mode) {
  size_t have_len = 0;
  char *have = read_small(path, &have_len);
  size_t len = strlen(text);
  int same = have && have_len == len && memcmp(have, text, len) == 0;
  free(have);
  if (same) return 0;
  char tmp[4200];
  if (snprintf(tmp, sizeof tmp, "%s.torpor-new", path) >= (int)sizeof tmp) return ENAMETOOLONG;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
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

int identity_write_files(const char *root, const char *hostname, const char *machine_id, const char **failed) {
  char path[4096];
  char text[128];
  int err;
  if (hostname) {
    snprintf(path, sizeof path, "%s/etc/hostname", root);
    snprintf(text, sizeof text, "%s\n", hostname);
    if ((err = replace_file(path, text, 0644)) != 0) return *failed = "/etc/hostname", err;
    snprintf(path, sizeof path, "%s/etc/hosts", root);
    size_t len = 0;
    char *old = read_small(path, &len);
    if (!old && errno != ENOENT) return *failed = "/etc/hosts", errno;
    char *hosts = identity_hosts_text(old, len, hostname);
    free(old);
    if (!hosts) return *failed = "/etc/hosts", ENOMEM;
    err = replace_file(path, hosts, 0644);
    free(hosts);
    if (err) return *failed = "/etc/hosts", err;
  }
  if (machine_id) {
    snprintf(path, sizeof path, "%s/etc/machine-id", root);
    snprintf(text, sizeof text, "%s\n", machine_id);
    if ((err = replace_file(path, text, 0444)) != 0) return *failed = "/etc/machine-id", err;
  }
  return 0;
}
