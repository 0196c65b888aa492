/* testvm.agent_ready=1: the test guest stands in for the Linux guest's agent. Once the
 * vsock responder listens on the agent port it prints the line the real agent
 * (guest/agent, init.c) prints when it is ready, so the host's Sandbox.create runs
 * its whole path (readiness line, vsock port 1024, HELLO) against this guest. */
#ifndef TESTVM_AGENT_READY_H
#define TESTVM_AGENT_READY_H

#include <stdint.h>

/* `torpor-agent ready v1 <ms since entry> vsock:1024`, or, without a vsock device,
 * `agent_ready=error reason=no-vsock` (the host then times out, as with a broken agent).
 * tsc_at_entry: rdtsc() at the PVH entry. */
void agent_ready_announce(uint64_t tsc_at_entry);

#endif
