/* The agent-protocol responder of the test guest (docs/protocol.md, version 1):
 * HELLO, PING -> PONG, ECHO -> OK {data}, SYNC and RESUMED -> OK on vsock port 1024, with request ids
 * remembered so a re-asked ECHO is answered from memory, not run again. Frames use
 * the agent's own codec (guest/agent/proto/frame.c). Transport-free: the vsock
 * driver feeds bytes in and sends `out` back. */
#ifndef TESTVM_RESPONDER_H
#define TESTVM_RESPONDER_H

#include <stdint.h>

#define RESPONDER_IN_CAP (16u * 1024u)  /* also the connection's vsock buf_alloc */
#define RESPONDER_OUT_CAP (24u * 1024u)

struct responder {
  uint8_t in[RESPONDER_IN_CAP];
  uint32_t in_len;
  uint32_t skip;        /* payload bytes still to drop of a frame too large for `in` */
  uint8_t out[RESPONDER_OUT_CAP];
  uint32_t out_len;     /* answer bytes queued */
  uint32_t out_sent;    /* handed to the transport */
  uint32_t out_done;    /* transport finished with them */
  int closing;          /* protocol error: GOAWAY queued, close once it is sent */
};

void responder_reset(struct responder *r);
/* Copies up to n bytes into `in`; returns how many fit. */
uint32_t responder_feed(struct responder *r, const uint8_t *p, uint32_t n);
/* Answers every complete frame while `out` has room; returns the input bytes
 * consumed (the transport's flow-control credit to give back). */
uint32_t responder_process(struct responder *r);
/* The transport finished sending n bytes of `out`. */
void responder_sent(struct responder *r, uint32_t n);

struct responder_stats {
  uint32_t frames;   /* frames handled */
  uint32_t hellos;
  uint32_t pings;
  uint32_t echoes;
  uint32_t replays;  /* answers repeated from the request-id memory */
  uint32_t errors;   /* ERR answers and GOAWAYs */
};
extern struct responder_stats responder_stats;

#endif
