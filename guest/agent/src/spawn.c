#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pty.h"

extern char **environ;

enum stage { ST_NONE, ST_DEVNULL, ST_PTY_SLAVE, ST_DUP, ST_GROUPS, ST_SETGID, ST_SETUID, ST_CHDIR, ST_EXEC };
static const char *const stage_names[] = {"", "open /dev/null", "pty slave", "dup2", "setgroups", "setgid",
                                          "setuid", "chdir", "exec"};

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

/* The child's report to the parent before exec: stage and errno. */
static void child_fail(int report_fd, enum stage st) {
  int msg[2] = {(int)st, errno};
  ssize_t n = write(report_fd, msg, sizeof msg);
  (void)n;
  _exit(127);
}

static void child(const struct spawn_spec *sp, int report_fd, int in_r, int out_w, int err_w,
                  const char *slave_path) {
  /* The agent blocks SIGCHLD (signalfd) and ignores SIGPIPE; a fresh process expects
   * neither. Ignored dispositions survive exec, so reset them here. */
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, NULL);
  for (int sig = 1; sig < NSIG; sig++)
    if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
  setsid(); /* own session and process group: signals go to the group */
  if (sp->pty) {
    if (pty_attach_slave(slave_path) != 0) child_fail(report_fd, ST_PTY_SLAVE);
  } else {
    if (in_r < 0) {
      in_r = open("/dev/null", O_RDONLY);
      if (in_r < 0) child_fail(report_fd, ST_DEVNULL);
    }
    if (dup2(in_r, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) child_fail(report_fd, ST_DUP);
  }
  if (sp->switch_user) {
    int rc = sp->user_name ? initgroups(sp->user_name, sp->gid) : setgroups(0, NULL);
    if (rc != 0) child_fail(report_fd, ST_GROUPS);
    if (setgid(sp->gid) != 0) child_fail(report_fd, ST_SETGID);
    if (setuid(sp->uid) != 0) child_fail(report_fd, ST_SETUID);
  }
  if (sp->cwd && chdir(sp->cwd) != 0) child_fail(report_fd, ST_CHDIR);
  /* execvp searches the PATH of environ: make it the child's own environment. */
  environ = sp->envp;
  execvp(sp->argv[0], sp->argv);
  child_fail(report_fd, ST_EXEC);
}

static void close_if(int fd) {
  if (fd >= 0) close(fd);
}

int spawn_process(const struct spawn_spec *sp, struct spawn_result *r) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, report[2] = {-1, -1};
  int master = -1;
  char slave_path[128] = "";
  memset(r, 0, sizeof *r);
  r->out_fd = r->err_fd = r->in_fd = -1;
  r->stage = "pipe";
  if (pipe2(report, O_CLOEXEC) != 0) goto fail;
  if (sp->pty) {
    r->stage = "pty";
    master = pty_open(sp->rows ? sp->rows : 24, sp->cols ? sp->cols : 80, slave_path, sizeof slave_path);
    if (master < 0) goto fail;
  } else {
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) goto fail;
    if (sp->want_stdin && pipe2(in, O_CLOEXEC) != 0) goto fail;
    /* Larger pipes: fewer wakeups for chatty processes (best effort). */
    fcntl(out[0], F_SETPIPE_SZ, 256 * 1024);
  }
  r->stage = "fork";
  pid_t pid = fork();
  if (pid < 0) goto fail;
  if (pid == 0) child(sp, report[1], in[0], out[1], err[1], slave_path);
  close(report[1]);
  report[1] = -1;
  close_if(in[0]);
  close_if(out[1]);
  close_if(err[1]);
  in[0] = out[1] = err[1] = -1;
  /* Blocks until the child execs (the report pipe closes on exec) or fails; that is
   * short and bounded, like posix_spawn. */
  int msg[2];
  ssize_t n;
  do n = read(report[0], msg, sizeof msg);
  while (n < 0 && errno == EINTR);
  close(report[0]);
  report[0] = -1;
  if (n == (ssize_t)sizeof msg) {
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    r->stage = stage_names[msg[0] >= 0 && msg[0] <= ST_EXEC ? msg[0] : 0];
    errno = msg[1];
    goto fail;
  }
  r->pid = pid;
  if (sp->pty) {
    r->out_fd = master;
    r->in_fd = fcntl(master, F_DUPFD_CLOEXEC, 0);
    if (r->in_fd >= 0) set_nonblock(r->in_fd);
  } else {
    r->out_fd = out[0];
    r->err_fd = err[0];
    r->in_fd = in[1];
    set_nonblock(out[0]);
    set_nonblock(err[0]);
    if (in[1] >= 0) set_nonblock(in[1]);
  }
  return 0;
fail:
  r->err = errno;
  close_if(in[0]);
  close_if(in[1]);
  close_if(out[0]);
  close_if(out[1]);
  close_if(err[0]);
  close_if(err[1]);
  close_if(report[0]);
  close_if(report[1]);
  close_if(master);
  return -1;
}
