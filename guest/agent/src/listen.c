#include "listen.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/vm_sockets.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "conn.h"
#include "log.h"

static struct watcher listener;
static char unix_path[108];
/* Held open so that, out of descriptors, the agent can still accept and close a pending
 * connection instead of spinning on a listener that stays readable. */
static int reserve_fd = -1;

static void on_accept(struct watcher *w, uint32_t events) {
  (void)events;
  for (int i = 0; i < 64; i++) {
    int fd = accept4(w->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      conn_accept_fd(fd);
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if ((errno == EMFILE || errno == ENFILE) && reserve_fd >= 0) {
      log_error("accept: out of file descriptors: refusing a connection");
      close(reserve_fd);
      int victim = accept4(w->fd, NULL, NULL, SOCK_CLOEXEC);
      if (victim >= 0) close(victim);
      reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) log_error("accept: %s", strerror(errno));
    return;
  }
}

int listen_start(const struct agent_options *o) {
  int fd;
  if (o->listen_kind == LISTEN_UNIX) {
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, o->unix_path, sizeof a.sun_path - 1);
    struct stat st;
    /* A stale socket of an earlier run; never remove anything else. */
    if (lstat(o->unix_path, &st) == 0 && S_ISSOCK(st.st_mode)) unlink(o->unix_path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) goto fail;
    strncpy(unix_path, o->unix_path, sizeof unix_path - 1);
  } else {
    struct sockaddr_vm a;
    memset(&a, 0, sizeof a);
    a.svm_family = AF_VSOCK;
    a.svm_cid = VMADDR_CID_ANY;
    a.svm_port = o->vsock_port;
    fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) goto fail;
  }
  if (listen(fd, 128) != 0) goto fail;
  if (reserve_fd < 0) reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  listener.fd = fd;
  listener.fn = on_accept;
  if (loop_watch(&listener, EPOLLIN) != 0) goto fail;
  return 0;
fail: {
  int e = errno;
  close(fd);
  errno = e;
  return -1;
}
}

static struct watcher knocker = {.fd = -1};

static void on_knock_answered(struct watcher *w, uint32_t events) {
  (void)events; /* refused (the expected answer), reset or timed out: all the same to us */
  loop_unwatch(w);
  close(w->fd);
  w->fd = -1;
}

void listen_knock(const struct agent_options *o) {
  if (o->listen_kind != LISTEN_VSOCK || knocker.fd >= 0) return;
  int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    log_info("knock: socket: %s", strerror(errno));
    return;
  }
  struct sockaddr_vm a;
  memset(&a, 0, sizeof a);
  a.svm_family = AF_VSOCK;
  a.svm_cid = VMADDR_CID_HOST;
  a.svm_port = AGENT_KNOCK_PORT;
  int r = connect(fd, (struct sockaddr *)&a, sizeof a);
  if (r != 0 && errno == EINPROGRESS) {
    knocker.fd = fd;
    knocker.fn = on_knock_answered;
    if (loop_watch(&knocker, EPOLLOUT) == 0) return;
    knocker.fd = -1;
  } else if (r != 0 && errno != ECONNRESET && errno != ECONNREFUSED) {
    /* ENODEV: no vsock transport to a host (e.g. QEMU without a vsock device): nobody to tell. */
    log_info("knock: connect to the host's vsock port %u: %s", AGENT_KNOCK_PORT, strerror(errno));
  }
  close(fd);
}

void listen_cleanup(void) {
  if (unix_path[0]) unlink(unix_path);
}
