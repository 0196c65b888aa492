/* The event loop's watcher lifetime rule, under ASan (make -C guest/agent test): a callback
 * may unwatch and free another watcher whose event is already in the batch being
 * dispatched; that event must never reach the freed watcher. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "loop.h"

static struct watcher *ws[2];
static int calls;
static int fds[2][2];

static uint64_t no_deadline(void) { return 0; /* poll: never block the test */ }
static void tick(void) { loop_stop(); }

/* Whichever runs first unwatches and frees the other, then itself. */
static void on_ready(struct watcher *w, uint32_t events) {
  (void)events;
  calls++;
  for (int i = 0; i < 2; i++) {
    if (!ws[i]) continue;
    loop_unwatch(ws[i]);
    if (ws[i] != w) free(ws[i]);
    ws[i] = NULL;
  }
  free(w);
}

int main(void) {
  if (loop_init() != 0) return 1;
  for (int i = 0; i < 2; i++) {
    if (pipe(fds[i]) != 0 || write(fds[i][1], "x", 1) != 1) return 1;
    ws[i] = calloc(1, sizeof *ws[i]);
    ws[i]->fd = fds[i][0];
    ws[i]->fn = on_ready;
    if (loop_watch(ws[i], EPOLLIN) != 0) return 1;
  }
  /* Both pipes are readable: one epoll_wait returns both events in one batch. */
  loop_run(no_deadline, tick);
  if (calls != 1) {
    fprintf(stderr, "loop_test: %d callbacks ran; the freed watcher's event must be dropped\n", calls);
    return 1;
  }
  puts("loop_test: all checks passed");
  return 0;
}
