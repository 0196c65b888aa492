/* The listening socket: a Unix socket path (host mode) or a vsock port (guest). */
#ifndef AGENT_LISTEN_H
#define AGENT_LISTEN_H

#include "args.h"

/* 0 when listening (new connections go to conn_accept_fd), -1 with errno. */
int listen_start(const struct agent_options *o);
/* The host port the agent knocks on once it listens (docs/protocol.md, "The knock"). */
#define AGENT_KNOCK_PORT 1023u
/* Knocks (vsock only): a non-blocking connection request to the host (CID 2) on
 * AGENT_KNOCK_PORT, which the host counts as "the agent listens now" and refuses. The
 * refusal (ECONNRESET) or a connect timeout closes the socket; nothing else happens. */
void listen_knock(const struct agent_options *o);
/* Removes the Unix socket file, if any. */
void listen_cleanup(void);

#endif
