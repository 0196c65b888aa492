/* torpor-agent: PID 1 of a torpor guest and the server of docs/protocol.md.
 * Also runs as an ordinary process on the host (--listen unix:PATH) for tests. */
#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "args.h"
#include "users.h"
#include "conn.h"
#include "dispatch.h"
#include "init.h"
#include "listen.h"
#include "log.h"
#include "loop.h"
#include "proc.h"
#include "util.h"
#include "watch.h"

static struct agent_options opts;
static struct watcher sigw;
static int listening;
static uint64_t listen_retry_ms;

static void on_signal(struct watcher *w, uint32_t events) {
  (void)events;
  struct signalfd_siginfo si;
  while (read(w->fd, &si, sizeof si) == (ssize_t)sizeof si) {
    if (si.ssi_signo == SIGCHLD) {
      proc_reap_children();
    } else if (!opts.is_pid1) { /* SIGTERM, SIGINT: only an ordinary process stops */
      log_info("signal %u: stopping", si.ssi_signo);
      loop_stop();
    }
  }
}

static void try_listen(void) {
  if (listen_start(&opts) == 0) {
    listening = 1;
    init_ready(&opts);  /* for humans: the host waits for the knock */
    listen_knock(&opts);
    return;
  }
  log_error("listen on %s: %s%s", opts.listen_spec, strerror(errno), opts.is_pid1 ? " (retrying)" : "");
  listen_retry_ms = now_ms() + 1000;
}

static uint64_t next_deadline(void) {
  uint64_t d = proc_next_deadline();
  uint64_t c = conn_next_deadline();
  if (c < d) d = c;
  uint64_t wd = watch_next_deadline();
  if (wd < d) d = wd;
  if (!listening && listen_retry_ms < d) d = listen_retry_ms;
  return d;
}

static void on_tick(void) {
  proc_tick();
  watch_tick();
  conn_collect();
  if (!listening && now_ms() >= listen_retry_ms) try_listen();
}

/* As PID 1 the agent must never exit: the kernel would panic. */
static int fatal(const char *what) {
  log_error("%s: %s", what, strerror(errno));
  if (!opts.is_pid1) return 1;
  for (;;) pause();
}

int main(int argc, char **argv) {
  init_stdio();
  switch (args_parse(argc, argv, &opts)) {
    case ARGS_OK: break;
    case ARGS_EXIT_OK:
      if (!opts.is_pid1) return 0;
      args_parse(1, argv, &opts); /* --help on a kernel command line: PID 1 never exits */
      break;
    case ARGS_USAGE:
      if (!opts.is_pid1) return 2;
      /* PID 1 serves with the defaults rather than panic the kernel. */
      args_parse(1, argv, &opts);
      break;
  }
  log_set_quiet(opts.quiet);
  if (opts.init) init_system(&opts);
  if (opts.subreaper) init_subreaper();
  dispatch_set_init_mode(opts.is_pid1);
  /* The image's `user` account (uid 1000) is the guest's default user, as in E2B's. */
  if (!opts.user && opts.is_pid1 && getpwnam("user")) opts.user = "user";
  users_set_default(opts.user);

  signal(SIGPIPE, SIG_IGN);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  if (loop_init() != 0) return fatal("epoll_create1");
  sigw.fd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  sigw.fn = on_signal;
  if (sigw.fd < 0 || loop_watch(&sigw, EPOLLIN) != 0) return fatal("signalfd");
  proc_table_init();

  try_listen();
  if (!listening && !opts.is_pid1) return 1;
  loop_run(next_deadline, on_tick);
  listen_cleanup();
  proc_kill_all();
  return 0;
}
