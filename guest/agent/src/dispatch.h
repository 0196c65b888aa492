/* Routes each incoming frame: control frames on stream 0, CREDIT/CANCEL and follow-up
 * frames to open streams, new requests to their handler (handlers.h). */
#ifndef AGENT_DISPATCH_H
#define AGENT_DISPATCH_H

#include "conn.h"

void dispatch_frame(struct conn *c, const struct frame *f);

/* Set once at start, true only when the agent is PID 1 (of the machine or of a PID
 * namespace): only then does POWEROFF call reboot(2), and RESUMED failures are errors.
 * (--init alone never powers anything off: that would be the host.) */
void dispatch_set_init_mode(int init_mode);
int dispatch_init_mode(void);

#endif
