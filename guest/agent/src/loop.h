/* The agent's single-threaded event loop: epoll over watchers, plus a tick that the
 * owners of deadlines (exec timeouts, output drain) hook into. */
#ifndef AGENT_LOOP_H
#define AGENT_LOOP_H

#include <stdint.h>

struct watcher;
typedef void (*watcher_fn)(struct watcher *w, uint32_t events);

struct watcher {
  int fd;
  uint32_t events; /* currently registered epoll events */
  int registered;
  watcher_fn fn;
  void *ctx;
};

int loop_init(void);
/* Registers or updates w->fd with these events (0 keeps it registered but silent). */
int loop_watch(struct watcher *w, uint32_t events);
/* Removes w from epoll. Afterwards no event reaches w, not even one already fetched in
 * the batch being dispatched: the owner may free w right after this call. */
void loop_unwatch(struct watcher *w);
/* Runs until loop_stop(); each iteration waits at most until the deadline that
 * loop_next_deadline_ms (set by the caller) returns, then calls on_tick. */
void loop_run(uint64_t (*next_deadline_ms)(void), void (*on_tick)(void));
void loop_stop(void);

#endif
