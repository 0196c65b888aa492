/* The listening socket: a Unix socket path (host mode) or a vsock port (guest). */
#ifndef AGENT_LISTEN_H
#define AGENT_LISTEN_H

#include "args.h"

/* 0 when listening (new connections go to conn_accept_fd), -1 with errno. */
int listen_start(const struct agent_options *o);
/* Removes the Unix socket file, if any. */
void listen_cleanup(void);

#endif
