#include "init.h"
#include "netcfg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "conn.h"
#include "log.h"
#include "util.h"

void init_stdio(void) {
  for (int fd = 0; fd < 3; fd++) {
    if (fcntl(fd, F_GETFD) >= 0) continue;
    int n = open("/dev/null", O_RDWR);
    if (n >= 0 && n != fd) {
      dup2(n, fd);
      close(n);
    }
  }
}

/* A mount point is a directory whose device differs from its parent's. */
static int is_mount_point(const char *path) {
  struct stat a, b;
  char parent[256];
  size_t n = strlen(path);
  if (n + 4 > sizeof parent) return 0;
  memcpy(parent, path, n);
  memcpy(parent + n, "/..", 4);
  if (stat(path, &a) != 0 || stat(parent, &b) != 0) return 0;
  return a.st_dev != b.st_dev;
}

struct mount_spec {
  const char *target, *fstype, *options;
  unsigned long flags;
};

static const struct mount_spec mounts[] = {
    {"/proc", "proc", NULL, MS_NOSUID | MS_NODEV | MS_NOEXEC},
    {"/sys", "sysfs", NULL, MS_NOSUID | MS_NODEV | MS_NOEXEC},
    {"/dev", "devtmpfs", "mode=0755", MS_NOSUID},
    {"/dev/pts", "devpts", "gid=5,mode=0620,ptmxmode=0666", MS_NOSUID | MS_NOEXEC},
    {"/dev/shm", "tmpfs", "mode=1777", MS_NOSUID | MS_NODEV},
    {"/tmp", "tmpfs", "mode=1777", MS_NOSUID | MS_NODEV},
    {"/run", "tmpfs", "mode=0755", MS_NOSUID | MS_NODEV},
};

static void mount_all(void) {
  for (size_t i = 0; i < sizeof mounts / sizeof mounts[0]; i++) {
    const struct mount_spec *m = &mounts[i];
    mkdir(m->target, 0755);
    if (is_mount_point(m->target)) continue;
    if (mount(m->fstype, m->target, m->fstype, m->flags, m->options) != 0)
      log_error("mount %s on %s: %s", m->fstype, m->target, strerror(errno));
  }
  /* What devtmpfs does not provide but shells expect (process substitution, /dev/stdin). */
  static const char *const links[][2] = {{"/proc/self/fd", "/dev/fd"},
                                         {"/proc/self/fd/0", "/dev/stdin"},
                                         {"/proc/self/fd/1", "/dev/stdout"},
                                         {"/proc/self/fd/2", "/dev/stderr"}};
  for (size_t i = 0; i < sizeof links / sizeof links[0]; i++)
    if (symlink(links[i][0], links[i][1]) != 0 && errno != EEXIST)
      log_error("symlink %s: %s", links[i][1], strerror(errno));
}

/* -1 when unknown, else whether /proc/self/ns/<ns> and /proc/<pid>/ns/<ns> are one. */
static int same_namespace(const char *ns, pid_t pid) {
  char a[256], b[256], mine[64], other[64];
  snprintf(mine, sizeof mine, "/proc/self/ns/%s", ns);
  snprintf(other, sizeof other, "/proc/%d/ns/%s", (int)pid, ns);
  ssize_t na = readlink(mine, a, sizeof a - 1), nb = readlink(other, b, sizeof b - 1);
  if (na <= 0 || nb <= 0) return -1;
  return na == nb && memcmp(a, b, (size_t)na) == 0;
}

/* Whether namespace `ns` ("mnt", "uts") may be the host's: shared with the system's
 * PID 1 or, when that one cannot be inspected (a container), with our parent. Unknown
 * counts as shared. */
static int maybe_host_namespace(const char *ns) {
  int with_init = same_namespace(ns, 1);
  if (with_init >= 0) return with_init;
  int with_parent = same_namespace(ns, getppid());
  return with_parent != 0;
}

void init_system(const struct agent_options *o) {
  /* --init on a host must never mount over the host's /tmp or rename the host: outside
   * PID 1, act only inside namespaces of its own (unshare --mount --uts). */
  int may_mount = o->is_pid1 || !maybe_host_namespace("mnt");
  int may_name = o->is_pid1 || !maybe_host_namespace("uts");
  if (may_mount)
    mount_all();
  else
    log_error("--init: not in a mount namespace of its own: mounts skipped");
  init_stdio(); /* /dev/null exists now if the kernel found no /dev at boot */
  if (!may_name)
    log_error("--init: not in a UTS namespace of its own: hostname left alone");
  else if (sethostname(o->hostname, strlen(o->hostname)) != 0)
    log_error("sethostname: %s", strerror(errno));
  if (o->is_pid1) {
    umask(022);
    netcfg_apply_from_cmdline();
    /* Every connection, stream and process costs descriptors: take what the kernel allows. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
    /* The kernel hands init HOME=/ and TERM=linux and no PATH. */
    setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 0);
    setenv("HOME", "/root", 1);
    /* stdio may have been closed at boot (no /dev/console in the image): use the console now. */
    int c = open("/dev/console", O_RDWR | O_NOCTTY);
    if (c >= 0) {
      struct stat st;
      for (int fd = 0; fd < 3; fd++)
        if (fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3)
          dup2(c, fd); /* was /dev/null */
      close(c);
    }
  }
}

void init_subreaper(void) {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) log_error("PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
}

void init_ready(const struct agent_options *o) {
  char line[256];
  int n = snprintf(line, sizeof line, "torpor-agent ready v1 %llu %s\n", (unsigned long long)boot_ms(), o->listen_spec);
  if (n < 0 || (size_t)n >= sizeof line) return;
  int fd = 1, opened = 0;
  if (strcmp(o->console, "-") != 0) {
    fd = open(o->console, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    opened = fd >= 0;
    if (!opened) {
      log_error("open %s: %s (readiness line on stdout)", o->console, strerror(errno));
      fd = 1;
    }
  }
  ssize_t w = write(fd, line, (size_t)n);
  (void)w;
  if (opened) close(fd);
}

void init_shutdown(int reboot_instead) {
  conn_flush_all_blocking(500);
  sync();
  /* Without ACPI (our guest kernel) a power-off only halts the CPUs, which the VMM
   * cannot see (HLT stays inside KVM); the i8042 reset of RB_AUTOBOOT stops the machine
   * visibly. So power off for real only where the kernel can. */
  struct stat st;
  int can_power_off = stat("/sys/firmware/acpi", &st) == 0;
  int cmd = reboot_instead || !can_power_off ? RB_AUTOBOOT : RB_POWER_OFF;
  log_info("%s", cmd == RB_AUTOBOOT ? "rebooting (i8042 reset)" : "powering off");
  if (reboot(cmd) != 0) log_error("reboot(2): %s", strerror(errno));
}
