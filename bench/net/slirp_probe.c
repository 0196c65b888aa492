/* libslirp (QEMU's -netdev user stack) measured the way bench/net.ts measures passt: the cost
 * of one instance (time to create it, resident memory it adds to the process that hosts it)
 * and an ARP request for the gateway answered. In torpor it would run inside the user's
 * Node process: that memory and that parsing of guest packets would be the user's.
 *   cc -O2 bench/net/slirp_probe.c -lslirp -o /tmp/slirp_probe && /tmp/slirp_probe */
#include <arpa/inet.h>
#include <slirp/libslirp.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static int replies;
static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static long rss_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb;
}
static ssize_t send_packet(const void *buf, size_t len, void *opaque) {
  const unsigned char *f = buf;
  (void)opaque;
  if (len >= 42 && f[12] == 0x08 && f[13] == 0x06 && f[21] == 2) replies++;
  return (ssize_t)len;
}
static void guest_error(const char *msg, void *opaque) { (void)msg, (void)opaque; }
static int64_t clock_ns(void *opaque) { (void)opaque; return (int64_t)(now_us() * 1000); }
static void *timer_new(SlirpTimerCb cb, void *a, void *b) { (void)cb, (void)a, (void)b; return (void *)1; }
static void timer_free(void *t, void *o) { (void)t, (void)o; }
static void timer_mod(void *t, int64_t e, void *o) { (void)t, (void)e, (void)o; }
static void reg(int fd, void *o) { (void)fd, (void)o; }
static void notify(void *o) { (void)o; }

int main(void) {
  SlirpCb cb = {.send_packet = send_packet, .guest_error = guest_error, .clock_get_ns = clock_ns,
                .timer_new = timer_new, .timer_free = timer_free, .timer_mod = timer_mod,
                .register_poll_fd = reg, .unregister_poll_fd = reg, .notify = notify};
  SlirpConfig cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.version = 1;
  cfg.in_enabled = true;
  inet_pton(AF_INET, "10.0.2.0", &cfg.vnetwork);
  inet_pton(AF_INET, "255.255.255.0", &cfg.vnetmask);
  inet_pton(AF_INET, "10.0.2.2", &cfg.vhost);
  inet_pton(AF_INET, "10.0.2.15", &cfg.vdhcp_start);
  inet_pton(AF_INET, "10.0.2.3", &cfg.vnameserver);
  cfg.if_mtu = cfg.if_mru = 1500;
  cfg.disable_host_loopback = true;
  long before = rss_kb();
  double t0 = now_us();
  enum { N = 16 };
  Slirp *s[N];
  for (int i = 0; i < N; i++) s[i] = slirp_new(&cfg, &cb, NULL);
  double t1 = now_us();
  unsigned char arp[42] = {0};
  memset(arp, 0xff, 6);
  unsigned char mac[6] = {0x52, 0x54, 0, 1, 2, 3};
  memcpy(arp + 6, mac, 6);
  arp[12] = 0x08, arp[13] = 0x06, arp[15] = 1, arp[16] = 0x08, arp[18] = 6, arp[19] = 4, arp[21] = 1;
  memcpy(arp + 22, mac, 6);
  inet_pton(AF_INET, "10.0.2.15", arp + 28);
  inet_pton(AF_INET, "10.0.2.2", arp + 38);
  double t2 = now_us();
  for (int i = 0; i < N; i++) slirp_input(s[i], arp, sizeof arp);
  double t3 = now_us();
  long after = rss_kb();
  printf("{\"instances\":%d,\"create_us_each\":%.1f,\"arp_us_each\":%.2f,\"rss_kib_each\":%.1f,\"arp_replies\":%d}\n", N,
         (t1 - t0) / N, (t3 - t2) / N, (double)(after - before) / N, replies);
  for (int i = 0; i < N; i++) slirp_cleanup(s[i]);
  return replies == N ? 0 : 1;
}
