/* The guest's network interface, configured statically from the kernel command line
 * (no DHCP client in the image): torpor.net=ADDR/PREFIX,GATEWAY[,DNS]
 * e.g. torpor.net=10.0.2.15/24,10.0.2.2,10.0.2.3. The host picks the addresses and gives
 * the same ones to its network backend (lib/net/), so they are known before boot and
 * stay the same across pause and resume. */
#ifndef AGENT_NETCFG_H
#define AGENT_NETCFG_H

#include <netinet/in.h>

struct net_config {
  struct in_addr addr, gateway, dns;
  int prefix;  /* 1..32 */
  int has_dns;
};

/* Finds torpor.net= in a kernel command line and parses it. 1: found and valid; 0: absent;
 * -1: present but malformed. */
int netcfg_parse_cmdline(const char *cmdline, struct net_config *out);
/* lo up, then the first other interface up with the address, its prefix and a default
 * route through the gateway; /etc/resolv.conf names the DNS server. Failures are logged,
 * never fatal. No torpor.net= in /proc/cmdline: only lo is brought up. */
void netcfg_apply_from_cmdline(void);
/* Gives the first Ethernet interface the MAC `mac` (virtio-net changes it live; frames for
 * the old address are dropped from then on). 0 when it has it; ENODEV when there is no such
 * interface; else the errno of the ioctl. */
int netcfg_set_mac(const unsigned char mac[6]);

#endif
