#include "netcfg.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <net/route.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

static int parse_addr(const char *s, size_t n, struct in_addr *out) {
  char buf[INET_ADDRSTRLEN];
  if (n == 0 || n >= sizeof(buf)) return -1;
  memcpy(buf, s, n);
  buf[n] = 0;
  return inet_pton(AF_INET, buf, out) == 1 ? 0 : -1;
}

int netcfg_parse_cmdline(const char *cmdline, struct net_config *out) {
  static const char key[] = "torpor.net=";
  const char *p = cmdline;
  const char *v = NULL;
  while ((p = strstr(p, key)) != NULL) {
    if (p == cmdline || p[-1] == ' ') v = p + sizeof(key) - 1; /* the last one wins, as with the kernel's own */
    p += sizeof(key) - 1;
  }
  if (!v) return 0;
  size_t len = strcspn(v, " \n");
  const char *end = v + len;
  memset(out, 0, sizeof(*out));
  const char *slash = memchr(v, '/', len);
  const char *comma = memchr(v, ',', len);
  if (!slash || !comma || slash > comma) return -1;
  if (parse_addr(v, (size_t)(slash - v), &out->addr) != 0) return -1;
  char *pe;
  long prefix = strtol(slash + 1, &pe, 10);
  if (pe != comma || prefix < 1 || prefix > 32) return -1;
  out->prefix = (int)prefix;
  const char *gw = comma + 1;
  const char *comma2 = memchr(gw, ',', (size_t)(end - gw));
  if (parse_addr(gw, (size_t)((comma2 ? comma2 : end) - gw), &out->gateway) != 0) return -1;
  if (comma2) {
    if (parse_addr(comma2 + 1, (size_t)(end - comma2 - 1), &out->dns) != 0) return -1;
    out->has_dns = 1;
  }
  return 1;
}

static int set_up(int s, const char *name) {
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) return -1;
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  return ioctl(s, SIOCSIFFLAGS, &ifr);
}

static void sin_of(struct sockaddr *sa, struct in_addr a) {
  struct sockaddr_in sin;
  memset(&sin, 0, sizeof(sin));
  sin.sin_family = AF_INET;
  sin.sin_addr = a;
  memcpy(sa, &sin, sizeof(sin));
}

/* The first interface that is not loopback (virtio-net's eth0). */
static int first_ether(char *name, size_t size) {
  struct if_nameindex *list = if_nameindex();
  if (!list) return -1;
  int found = -1;
  for (struct if_nameindex *i = list; i->if_index != 0; i++) {
    if (strcmp(i->if_name, "lo") == 0) continue;
    snprintf(name, size, "%s", i->if_name);
    found = 0;
    break;
  }
  if_freenameindex(list);
  return found;
}

static void write_resolv_conf(struct in_addr dns) {
  char text[64];
  char a[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &dns, a, sizeof(a));
  int n = snprintf(text, sizeof(text), "nameserver %s\n", a);
  int fd = open("/etc/resolv.conf.torpor", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || write(fd, text, (size_t)n) != n || fsync(fd) != 0) {
    log_error("net: /etc/resolv.conf: %s", strerror(errno));
    if (fd >= 0) close(fd);
    return;
  }
  close(fd);
  if (rename("/etc/resolv.conf.torpor", "/etc/resolv.conf") != 0) log_error("net: rename resolv.conf: %s", strerror(errno));
}

void netcfg_apply_from_cmdline(void) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) {
    log_error("net: socket: %s", strerror(errno));
    return;
  }
  if (set_up(s, "lo") != 0) log_error("net: lo up: %s", strerror(errno));
  char cmdline[4096] = {0};
  int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, cmdline, sizeof(cmdline) - 1);
    if (n > 0) cmdline[n] = 0;
    close(fd);
  }
  struct net_config c;
  int found = netcfg_parse_cmdline(cmdline, &c);
  if (found <= 0) {
    if (found < 0) log_error("net: malformed torpor.net= on the kernel command line: network left down");
    close(s);
    return;
  }
  char name[IFNAMSIZ];
  if (first_ether(name, sizeof(name)) != 0) {
    log_error("net: torpor.net= given but no network interface");
    close(s);
    return;
  }
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
  sin_of(&ifr.ifr_addr, c.addr);
  if (ioctl(s, SIOCSIFADDR, &ifr) != 0) log_error("net: %s address: %s", name, strerror(errno));
  struct in_addr mask;
  mask.s_addr = htonl(c.prefix == 32 ? 0xffffffffu : ~(0xffffffffu >> c.prefix));
  sin_of(&ifr.ifr_netmask, mask);
  if (ioctl(s, SIOCSIFNETMASK, &ifr) != 0) log_error("net: %s netmask: %s", name, strerror(errno));
  if (set_up(s, name) != 0) log_error("net: %s up: %s", name, strerror(errno));
  struct rtentry rt;
  memset(&rt, 0, sizeof(rt));
  struct in_addr any = {0};
  sin_of(&rt.rt_dst, any);
  sin_of(&rt.rt_genmask, any);
  sin_of(&rt.rt_gateway, c.gateway);
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  rt.rt_dev = name;
  if (ioctl(s, SIOCADDRT, &rt) != 0 && errno != EEXIST) log_error("net: default route: %s", strerror(errno));
  close(s);
  if (c.has_dns) write_resolv_conf(c.dns);
}

int netcfg_set_mac(const unsigned char mac[6]) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return errno;
  struct if_nameindex *list = if_nameindex();
  if (!list) {
    int err = errno;
    close(s);
    return err;
  }
  /* The first Ethernet interface: a kernel may add others (sit0, tunl0) that take no MAC. */
  struct ifreq ifr;
  int err = ENODEV;
  for (struct if_nameindex *i = list; i->if_index != 0; i++) {
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", i->if_name);
    if (ioctl(s, SIOCGIFHWADDR, &ifr) == 0 && ifr.ifr_hwaddr.sa_family == ARPHRD_ETHER) {
      err = 0;
      break;
    }
  }
  if_freenameindex(list);
  if (!err && memcmp(ifr.ifr_hwaddr.sa_data, mac, 6) != 0) {
    /* With arp_notify the kernel announces the new address (a gratuitous ARP) as it changes:
     * the backend learns it from that frame, not from whatever the guest sends first. */
    char knob[96];
    snprintf(knob, sizeof knob, "/proc/sys/net/ipv4/conf/%s/arp_notify", ifr.ifr_name);
    int k = open(knob, O_WRONLY | O_CLOEXEC);
    if (k < 0 || write(k, "1", 1) != 1) log_error("net: %s: %s", knob, strerror(errno));
    if (k >= 0) close(k);
    ifr.ifr_hwaddr.sa_family = ARPHRD_ETHER;
    memcpy(ifr.ifr_hwaddr.sa_data, mac, 6);
    if (ioctl(s, SIOCSIFHWADDR, &ifr) != 0) err = errno;
  }
  close(s);
  return err;
}
