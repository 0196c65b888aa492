/* torpor.net= parsing (make -C guest/agent test). */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "netcfg.h"
#include "check.h"

static const char *ip(struct in_addr a) {
  static char b[4][INET_ADDRSTRLEN];
  static int i;
  i = (i + 1) % 4;
  return inet_ntop(AF_INET, &a, b[i], sizeof(b[i]));
}

int main(void) {
  struct net_config c;
  CHECK(netcfg_parse_cmdline("console=ttyS0 torpor.net=10.0.2.15/24,10.0.2.2,10.0.2.3 quiet", &c) == 1);
  CHECK(strcmp(ip(c.addr), "10.0.2.15") == 0);
  CHECK(c.prefix == 24);
  CHECK(strcmp(ip(c.gateway), "10.0.2.2") == 0);
  CHECK(c.has_dns && strcmp(ip(c.dns), "10.0.2.3") == 0);
  CHECK(netcfg_parse_cmdline("torpor.net=192.168.1.5/16,192.168.0.1\n", &c) == 1);
  CHECK(!c.has_dns && c.prefix == 16);
  CHECK(netcfg_parse_cmdline("console=ttyS0 quiet", &c) == 0);
  CHECK(netcfg_parse_cmdline("xtorpor.net=10.0.2.15/24,10.0.2.2", &c) == 0);
  CHECK(netcfg_parse_cmdline("torpor.net=10.0.2.15/33,10.0.2.2", &c) == -1);
  CHECK(netcfg_parse_cmdline("torpor.net=10.0.2.15,10.0.2.2", &c) == -1);
  CHECK(netcfg_parse_cmdline("torpor.net=10.0.2.999/24,10.0.2.2", &c) == -1);
  CHECK(netcfg_parse_cmdline("torpor.net=10.0.2.15/24,10.0.2.2,nope", &c) == -1);
  CHECK(netcfg_parse_cmdline("torpor.net=", &c) == -1);
  CHECK(netcfg_parse_cmdline("torpor.net=1.2.3.4/8,5.6.7.8 torpor.net=10.0.2.15/24,10.0.2.2", &c) == 1);
  CHECK(strcmp(ip(c.addr), "10.0.2.15") == 0);
  if (failures) return 1;
  printf("netcfg_test: ok\n");
  return 0;
}
