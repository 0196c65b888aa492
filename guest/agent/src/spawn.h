/* Starting one process: fork, new session, stdio wiring (pipes or a pty), user switch,
 * cwd, exec. Failures before exec come back as an errno and a stage name. */
#ifndef AGENT_SPAWN_H
#define AGENT_SPAWN_H

#include <sys/types.h>

struct spawn_spec {
  char **argv;      /* argv[0] is looked up in the child's PATH */
  char **envp;      /* the complete environment */
  const char *cwd;  /* NULL: the agent's */
  int switch_user;  /* 1: setgroups/initgroups, setgid, setuid */
  uid_t uid;
  gid_t gid;
  const char *user_name; /* for initgroups; NULL: no supplementary groups */
  int pty;
  unsigned rows, cols;
  int want_stdin;
};

struct spawn_result {
  pid_t pid;
  int out_fd;   /* stdout pipe, or the pty master */
  int err_fd;   /* stderr pipe; -1 with a pty */
  int in_fd;    /* stdin pipe, or a dup of the pty master; -1 when stdin is /dev/null */
  int err;      /* errno on failure */
  const char *stage; /* what failed: "pipe", "fork", "chdir", "setuid", "exec", ... */
};

/* 0 on success; -1 with r->err and r->stage set. All fds are non-blocking, close-on-exec. */
int spawn_process(const struct spawn_spec *sp, struct spawn_result *r);

#endif
