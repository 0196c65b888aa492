#include "loop.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

static int epfd = -1;
static int stopping;
/* The batch loop_run is dispatching: events of a watcher unwatched during the batch are
 * struck out here, so its owner may free it at once and no later event of the same
 * batch reads (or calls through) freed memory. */
static struct epoll_event *batch;
static int batch_next, batch_len;

int loop_init(void) {
  epfd = epoll_create1(EPOLL_CLOEXEC);
  return epfd < 0 ? -1 : 0;
}

int loop_watch(struct watcher *w, uint32_t events) {
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = events;
  ev.data.ptr = w;
  if (w->registered && w->events == events) return 0;
  if (epoll_ctl(epfd, w->registered ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, w->fd, &ev) != 0) {
    log_error("epoll_ctl(fd %d): %s", w->fd, strerror(errno));
    return -1;
  }
  w->registered = 1;
  w->events = events;
  return 0;
}

void loop_unwatch(struct watcher *w) {
  if (!w->registered) return;
  if (epoll_ctl(epfd, EPOLL_CTL_DEL, w->fd, NULL) != 0) log_error("epoll_ctl(DEL fd %d): %s", w->fd, strerror(errno));
  w->registered = 0;
  w->events = 0;
  for (int i = batch_next; i < batch_len; i++)
    if (batch[i].data.ptr == w) batch[i].data.ptr = NULL;
}

void loop_stop(void) { stopping = 1; }

void loop_run(uint64_t (*next_deadline_ms)(void), void (*on_tick)(void)) {
  struct epoll_event evs[64];
  while (!stopping) {
    uint64_t deadline = next_deadline_ms();
    uint64_t now = now_ms();
    int timeout = -1;
    if (deadline != UINT64_MAX) timeout = deadline <= now ? 0 : (int)(deadline - now > 60000 ? 60000 : deadline - now);
    int n = epoll_wait(epfd, evs, 64, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      log_error("epoll_wait: %s", strerror(errno));
      continue; /* as PID 1 there is nowhere to go */
    }
    batch = evs;
    batch_len = n;
    for (int i = 0; i < n; i++) {
      batch_next = i + 1;
      struct watcher *w = evs[i].data.ptr;
      /* NULL: an earlier event of this batch unwatched it (and its owner may have freed
       * it); it is level-triggered, so one re-watched since then fires again next time. */
      if (w && w->registered) w->fn(w, evs[i].events);
    }
    batch = NULL;
    batch_len = batch_next = 0;
    on_tick();
  }
}
