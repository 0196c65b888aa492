#include "devices/virtio/net/egress_policy.h"

#include <algorithm>
#include <cstring>

namespace torpor {

namespace {

constexpr uint16_t kEtherArp = 0x0806, kEtherIpv4 = 0x0800, kEtherIpv6 = 0x86dd;
constexpr uint8_t kProtoTcp = 6, kProtoUdp = 17, kProtoIcmpv6 = 58;
constexpr size_t kEth = 14;

uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

bool port_allowed(const EgressPolicy& p, uint16_t port) {
  return std::find(p.guest_ports.begin(), p.guest_ports.end(), port) != p.guest_ports.end();
}

bool ipv4_allows(const EgressPolicy& p, const uint8_t* ip, size_t len) {
  if (len < 20 || (ip[0] >> 4) != 4) return false;
  size_t ihl = static_cast<size_t>(ip[0] & 0x0f) * 4;
  if (ihl < 20 || ihl > len) return false;
  uint32_t dst;
  std::memcpy(&dst, ip + 16, 4);
  if (std::find(p.allowed_ipv4.begin(), p.allowed_ipv4.end(), dst) != p.allowed_ipv4.end()) return true;
  if ((be16(ip + 6) & 0x1fff) != 0) return false;  // a later fragment: no ports to look at
  if (len - ihl < 4) return false;
  const uint8_t* l4 = ip + ihl;
  uint16_t sport = be16(l4), dport = be16(l4 + 2);
  if (ip[9] == kProtoTcp) return port_allowed(p, sport);
  if (ip[9] == kProtoUdp) return sport == 68 && dport == 67;  // DHCP
  return false;
}

bool ipv6_allows(const EgressPolicy& p, const uint8_t* ip, size_t len) {
  if (len < 40 || (ip[0] >> 4) != 6) return false;
  const uint8_t* l4 = ip + 40;
  size_t rest = len - 40;
  if (rest < 4) return false;
  uint8_t next = ip[6];
  if (next == kProtoIcmpv6) return l4[0] >= 133 && l4[0] <= 137;  // router/neighbour discovery
  if (next == kProtoTcp) return port_allowed(p, be16(l4));
  if (next == kProtoUdp) return be16(l4) == 546 && be16(l4 + 2) == 547;  // DHCPv6
  return false;
}

}  // namespace

bool egress_allows(const EgressPolicy& policy, const uint8_t* frame, size_t len) {
  if (policy.egress) return true;
  if (len < kEth) return false;
  uint16_t type = be16(frame + 12);
  if (type == kEtherArp) return true;
  if (type == kEtherIpv4) return ipv4_allows(policy, frame + kEth, len - kEth);
  if (type == kEtherIpv6) return ipv6_allows(policy, frame + kEth, len - kEth);
  return false;
}

}  // namespace torpor
