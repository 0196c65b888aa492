/* Init duties: what PID 1 of the guest owes the system before serving. */
#ifndef AGENT_INIT_H
#define AGENT_INIT_H

#include "args.h"

/* fds 0-2 open (to /dev/null if the kernel left them closed). */
void init_stdio(void);
/* Mounts, hostname, base environment, umask. Failures are logged, never fatal. */
void init_system(const struct agent_options *o);
/* prctl(PR_SET_CHILD_SUBREAPER). */
void init_subreaper(void);
/* The one readiness line, to the console or stdout. */
void init_ready(const struct agent_options *o);
/* Flushes answers, syncs, reboot(2): power off, or reboot (RB_AUTOBOOT). Returns only
 * when reboot(2) failed. */
void init_shutdown(int reboot);

#endif
