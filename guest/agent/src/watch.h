/* WATCH: a directory watched with inotify (files.watchDir). Events go into a bounded ring
 * per watch, numbered by `seq`; the attached stream is sent what it has not seen. A watch
 * outlives its connection (as a process does) for WATCH_DETACHED_MS, so a client that
 * reconnects re-attaches with its watch_id and the next seq it wants; events it can no
 * longer get are reported as one `overflow` event with the count, never dropped silently. */
#ifndef AGENT_WATCH_H
#define AGENT_WATCH_H

#include <stdint.h>

#include "conn.h"

#define WATCH_MAX 128             /* watches at once, over all connections */
#define WATCH_QUEUE 4096          /* events kept per watch */
#define WATCH_QUEUE_BYTES (256u * 1024u) /* and at most this many bytes of their names */
#define WATCH_MAX_DIRS 8192       /* directories of one recursive watch */
#define WATCH_DETACHED_MS 60000u  /* a watch nobody is attached to is kept this long */

void handle_watch(struct stream *s, const struct frame *f);
void watch_tick(void);
uint64_t watch_next_deadline(void);

#endif
