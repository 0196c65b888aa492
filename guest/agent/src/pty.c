#include "pty.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

int pty_resize(int master, unsigned rows, unsigned cols) {
  struct winsize ws;
  memset(&ws, 0, sizeof ws);
  ws.ws_row = (unsigned short)rows;
  ws.ws_col = (unsigned short)cols;
  return ioctl(master, TIOCSWINSZ, &ws);
}

int pty_open(unsigned rows, unsigned cols, char *slave_path, size_t path_size) {
  int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (m < 0) return -1;
  if (grantpt(m) != 0 || unlockpt(m) != 0 || ptsname_r(m, slave_path, path_size) != 0 ||
      pty_resize(m, rows, cols) != 0) {
    int e = errno;
    close(m);
    errno = e;
    return -1;
  }
  int fl = fcntl(m, F_GETFL);
  fcntl(m, F_SETFL, fl | O_NONBLOCK);
  return m;
}

int pty_attach_slave(const char *slave_path) {
  /* Called after setsid(): opening the slave without O_NOCTTY makes it the session's
   * controlling terminal; TIOCSCTTY says so explicitly for kernels that need it. */
  int s = open(slave_path, O_RDWR);
  if (s < 0) return -1;
  ioctl(s, TIOCSCTTY, 0);
  if (dup2(s, 0) < 0 || dup2(s, 1) < 0 || dup2(s, 2) < 0) return -1;
  if (s > 2) close(s);
  return 0;
}
