#include "users.h"

#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *default_user;

void users_set_default(const char *name) { default_user = name && *name ? name : NULL; }
const char *users_default(void) { return default_user; }

int users_resolve(const char *name, struct user_ctx *u) {
  memset(u, 0, sizeof *u);
  if (!name) name = default_user;
  if (!name) return 0;
  struct passwd *pw = getpwnam(name);
  if (!pw) return -1;
  u->set = 1;
  u->uid = pw->pw_uid;
  u->gid = pw->pw_gid;
  snprintf(u->name, sizeof u->name, "%s", pw->pw_name);
  snprintf(u->home, sizeof u->home, "%s", pw->pw_dir ? pw->pw_dir : "/");
  return 0;
}

char *users_path(const struct user_ctx *u, const char *path) {
  if (path[0] == '/' || !u->set || !u->home[0]) return strdup(path);
  size_t hl = strlen(u->home), pl = strlen(path);
  char *out = malloc(hl + pl + 2);
  if (!out) return NULL;
  int slash = hl > 0 && u->home[hl - 1] == '/';
  snprintf(out, hl + pl + 2, "%s%s%s", u->home, slash ? "" : "/", path);
  return out;
}

void users_chown_path(const struct user_ctx *u, const char *path) {
  if (!u->set || geteuid() != 0) return;
  if (lchown(path, u->uid, u->gid) != 0) { /* best effort */
  }
}

void users_chown_fd(const struct user_ctx *u, int fd) {
  if (!u->set || geteuid() != 0 || fd < 0) return;
  if (fchown(fd, u->uid, u->gid) != 0) { /* best effort */
  }
}

/* One-entry caches: listings run through one directory of one owner at a time. Reset per
 * request, so an account added in the guest is seen by the next one. */
static struct {
  int valid, found;
  unsigned id;
  char name[256];
} uid_cache, gid_cache;

const char *users_uid_name(uid_t uid) {
  if (!uid_cache.valid || uid_cache.id != uid) {
    struct passwd *pw = getpwuid(uid);
    uid_cache.valid = 1;
    uid_cache.id = uid;
    uid_cache.found = pw != NULL;
    if (pw) snprintf(uid_cache.name, sizeof uid_cache.name, "%s", pw->pw_name);
  }
  return uid_cache.found ? uid_cache.name : NULL;
}

const char *users_gid_name(gid_t gid) {
  if (!gid_cache.valid || gid_cache.id != gid) {
    struct group *gr = getgrgid(gid);
    gid_cache.valid = 1;
    gid_cache.id = gid;
    gid_cache.found = gr != NULL;
    if (gr) snprintf(gid_cache.name, sizeof gid_cache.name, "%s", gr->gr_name);
  }
  return gid_cache.found ? gid_cache.name : NULL;
}

void users_cache_reset(void) {
  uid_cache.valid = 0;
  gid_cache.valid = 0;
}
