// What the guest may send when its egress is off (network: { egress: false }): the frames
// that keep the link working (ARP, IPv6 neighbour discovery, DHCP), replies from the guest's
// forwarded TCP ports (the host connected to them), and packets to a few allowed IPv4
// addresses (the gateway when the host's loopback is mapped there). Everything else the
// guest sends is dropped in the device, before the backend sees it.
//
// The backend (passt) is told as much as it can be (no UDP, no ICMP); this is the part it
// cannot express: TCP must stay on in passt for the forwarded ports, so outbound TCP is
// stopped here. Parsing is minimal and bounds-checked: fixed offsets of the Ethernet, IPv4
// and IPv6 headers and the first 4 bytes of TCP/UDP; anything it does not understand
// (VLAN tags, IPv6 extension headers, IPv4 fragments after the first) is dropped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace torpor {

struct EgressPolicy {
  bool egress = true;                 // true: everything passes
  std::vector<uint16_t> guest_ports;  // TCP source ports whose packets pass (forwarded services)
  std::vector<uint32_t> allowed_ipv4; // destinations that pass, in network byte order
};

// True when the guest may send this Ethernet frame.
bool egress_allows(const EgressPolicy& policy, const uint8_t* frame, size_t len);

}  // namespace torpor
