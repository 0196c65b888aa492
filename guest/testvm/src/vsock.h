/* virtio-vsock driver: accepts host-initiated stream connections on the echo port
 * (7: bytes come back as they are) and the agent port (1024: the protocol responder
 * of responder.h). rx, tx and event queues; credit flow control; transport reset. */
#ifndef TESTVM_VSOCK_H
#define TESTVM_VSOCK_H

#include <stdint.h>

#include "virtio.h"

#define VSOCK_ECHO_PORT 7u
#define VSOCK_AGENT_PORT 1024u
/* The host port the agent knocks on once it listens (docs/protocol.md, "The knock"). */
#define VSOCK_KNOCK_PORT 1023u

const char *vsock_init(struct virtio_dev *d, int polled);
/* Handles whatever the device completed; called from the main loop. */
void vsock_poll(void);
/* 1 while the driver has work it could do now (e.g. echo bytes waiting on credit). */
int vsock_busy(void);
/* The guest CID read from the device config (at init and after a transport reset). */
uint64_t vsock_guest_cid(void);
/* The agent's knock: a REQUEST to the host (CID 2) port VSOCK_KNOCK_PORT. The host
 * answers RST, which needs nothing from us (a RST for no connection is dropped). */
void vsock_knock(void);
/* One `vsock=` line with the driver's counters. */
void vsock_report(void);

#endif
