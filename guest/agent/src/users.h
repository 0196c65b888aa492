/* Who a request acts as: the request's `user`, else the agent's default user (--user; as
 * PID 1, `user` when the image has that account), else the agent's own identity. Relative
 * paths of file requests are resolved against that user's home, and what a file request
 * creates is owned by that user (the agent itself runs as root in the guest). */
#ifndef AGENT_USERS_H
#define AGENT_USERS_H

#include <sys/types.h>

struct user_ctx {
  int set; /* 0: the agent's own identity (no default user, none asked) */
  uid_t uid;
  gid_t gid;
  char name[256];
  char home[4096];
};

/* The default user's name, or NULL for the agent's own identity. */
void users_set_default(const char *name);
const char *users_default(void);

/* Resolves `name` (NULL: the default). 0, or -1 when the name is not in /etc/passwd. */
int users_resolve(const char *name, struct user_ctx *u);

/* A fresh copy of path, made absolute against u's home when relative and u is set (else
 * as given: relative to the agent's cwd). NULL when memory runs out. */
char *users_path(const struct user_ctx *u, const char *path);

/* Gives a path (or fd >= 0) the user's ownership; nothing when u is unset or the agent
 * is not root. Best effort: errors are ignored, as for a root-created file. */
void users_chown_path(const struct user_ctx *u, const char *path);
void users_chown_fd(const struct user_ctx *u, int fd);

/* Names of a uid / gid for entries, cached (a listing names the same owner again and
 * again); NULL when the guest has no name for it. */
const char *users_uid_name(uid_t uid);
const char *users_gid_name(gid_t gid);
void users_cache_reset(void);

#endif
