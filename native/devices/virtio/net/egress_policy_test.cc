// The egress-off policy on hand-built frames: what keeps the link up and what answers the
// host passes, the guest's own connections and anything unparsable do not.
#include "devices/virtio/net/egress_policy.h"

#include <arpa/inet.h>

#include <cstring>
#include <vector>

#include "test/check.h"

using namespace torpor;

namespace {

std::vector<uint8_t> eth(uint16_t type, size_t payload) {
  std::vector<uint8_t> f(14 + payload);
  f[12] = static_cast<uint8_t>(type >> 8);
  f[13] = static_cast<uint8_t>(type);
  return f;
}

std::vector<uint8_t> ipv4(uint8_t proto, const char* dst, uint16_t sport, uint16_t dport, uint16_t frag = 0) {
  auto f = eth(0x0800, 20 + 8);
  uint8_t* ip = f.data() + 14;
  ip[0] = 0x45;
  ip[6] = static_cast<uint8_t>(frag >> 8);
  ip[7] = static_cast<uint8_t>(frag);
  ip[9] = proto;
  inet_pton(AF_INET, dst, ip + 16);
  ip[20] = static_cast<uint8_t>(sport >> 8);
  ip[21] = static_cast<uint8_t>(sport);
  ip[22] = static_cast<uint8_t>(dport >> 8);
  ip[23] = static_cast<uint8_t>(dport);
  return f;
}

std::vector<uint8_t> ipv6(uint8_t next, uint8_t b0, uint8_t b1 = 0) {
  auto f = eth(0x86dd, 40 + 8);
  f[14] = 0x60;
  f[14 + 6] = next;
  f[14 + 40] = b0;
  f[14 + 41] = b1;
  return f;
}

bool allows(const EgressPolicy& p, const std::vector<uint8_t>& f) { return egress_allows(p, f.data(), f.size()); }

EgressPolicy closed() {
  EgressPolicy p;
  p.egress = false;
  p.guest_ports = {8080};
  uint32_t gw;
  inet_pton(AF_INET, "10.0.2.2", &gw);
  p.allowed_ipv4 = {gw};
  return p;
}

}  // namespace

TEST("egress policy: egress on passes everything, even garbage") {
  EgressPolicy open;
  CHECK(allows(open, ipv4(6, "1.1.1.1", 40000, 443)));
  CHECK(allows(open, eth(0x1234, 10)));
}

TEST("egress policy off: ARP, NDP, DHCP and forwarded-port replies pass") {
  EgressPolicy p = closed();
  CHECK(allows(p, eth(0x0806, 28)));
  CHECK(allows(p, ipv4(17, "255.255.255.255", 68, 67)));
  CHECK(allows(p, ipv4(6, "10.0.2.2", 8080, 51000)));    // the guest's server answering
  CHECK(allows(p, ipv4(6, "203.0.113.9", 8080, 51000)));  // whoever the backend says connected
  CHECK(allows(p, ipv4(6, "10.0.2.2", 40000, 9000)));     // an allowed address (host loopback mapping)
  CHECK(allows(p, ipv6(58, 135)));                        // neighbour solicitation
  CHECK(allows(p, ipv6(6, 8080 >> 8, 8080 & 0xff)));
}

TEST("egress policy off: the guest's own connections and unparsable frames are dropped") {
  EgressPolicy p = closed();
  CHECK(!allows(p, ipv4(6, "1.1.1.1", 40000, 443)));
  CHECK(!allows(p, ipv4(17, "10.0.2.3", 40000, 53)));   // DNS
  CHECK(!allows(p, ipv4(1, "1.1.1.1", 0, 0)));          // ICMP
  CHECK(!allows(p, ipv4(6, "1.1.1.1", 8080, 443, 0x0010)));  // a later fragment
  CHECK(!allows(p, ipv6(58, 128)));                     // echo request
  CHECK(!allows(p, ipv6(6, 0x9c, 0x40)));               // TCP from port 40000
  CHECK(!allows(p, ipv6(0, 0)));                        // an extension header
  CHECK(!allows(p, eth(0x8100, 40)));                   // VLAN
  auto bad_ihl = ipv4(6, "1.1.1.1", 8080, 1);
  bad_ihl[14] = 0x4f;  // header longer than the frame
  CHECK(!allows(p, bad_ihl));
  auto short_frame = eth(0x0800, 10);
  CHECK(!allows(p, short_frame));
  CHECK(!egress_allows(p, short_frame.data(), 5));
}
