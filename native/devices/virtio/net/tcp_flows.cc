#include "devices/virtio/net/tcp_flows.h"

#include <cstring>

namespace torpor {

namespace {

constexpr size_t kEth = 14;
constexpr uint16_t kEtherIpv4 = 0x0800;
constexpr uint8_t kProtoTcp = 6;
constexpr uint8_t kFin = 0x01, kSyn = 0x02, kRst = 0x04, kAck = 0x10;

uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
uint32_t be32(const uint8_t* p) { return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3]; }
void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void put32(uint8_t* p, uint32_t v) {
  put16(p, static_cast<uint16_t>(v >> 16));
  put16(p + 2, static_cast<uint16_t>(v));
}

uint32_t sum16(const uint8_t* p, size_t len, uint32_t sum = 0) {
  for (size_t i = 0; i + 1 < len; i += 2) sum += be16(p + i);
  if (len & 1) sum += uint32_t{p[len - 1]} << 8;
  return sum;
}
uint16_t fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

// A plain IPv4 TCP segment at fixed offsets: its IP header, its TCP header (20+ bytes) and how
// many payload bytes it claims. False for anything else.
struct Segment {
  const uint8_t* ip;
  const uint8_t* tcp;
  uint32_t payload;
  uint8_t flags;
};

bool parse(const uint8_t* frame, size_t len, Segment* s) {
  if (len < kEth + 20 + 20 || be16(frame + 12) != kEtherIpv4) return false;
  const uint8_t* ip = frame + kEth;
  size_t ip_room = len - kEth;
  if ((ip[0] >> 4) != 4 || ip[9] != kProtoTcp) return false;
  size_t ihl = static_cast<size_t>(ip[0] & 0x0f) * 4;
  size_t total = be16(ip + 2);
  if (ihl < 20 || total > ip_room || total < ihl + 20) return false;
  if ((be16(ip + 6) & 0x3fff) != 0) return false;  // a fragment (MF set, or an offset)
  const uint8_t* tcp = ip + ihl;
  size_t doff = static_cast<size_t>(tcp[12] >> 4) * 4;
  if (doff < 20 || ihl + doff > total) return false;
  *s = {ip, tcp, static_cast<uint32_t>(total - ihl - doff), tcp[13]};
  return true;
}

}  // namespace

bool TcpFlowTable::add(const Key& k) {
  auto it = flows_.find(k);
  if (it != flows_.end()) {
    it->second = 0;  // a new connection on an ended flow's ports: live again
    return true;
  }
  if (flows_.size() >= kMaxFlows) {
    // Room from flows that ended (both FINs seen); none: the table stays as it is.
    for (auto it = flows_.begin(); it != flows_.end();) {
      if (it->second == (kGuestFin | kRemoteFin)) it = flows_.erase(it);
      else ++it;
    }
    if (flows_.size() >= kMaxFlows) {
      overflowed_ = true;
      return false;
    }
  }
  flows_.emplace(k, 0);
  return true;
}

bool TcpFlowTable::guest_sends(const uint8_t* frame, size_t len, std::vector<uint8_t>* reset) {
  Segment s;
  if (!parse(frame, len, &s)) return true;
  Key k{};
  std::memcpy(&k.guest_ip, s.ip + 12, 4);
  std::memcpy(&k.remote_ip, s.ip + 16, 4);
  k.guest_port = be16(s.tcp);
  k.remote_port = be16(s.tcp + 2);
  if (s.flags & kRst) {
    flows_.erase(k);
    return true;
  }
  if ((s.flags & kSyn) && !(s.flags & kAck)) {
    add(k);  // a connection the guest opens (a full table: it passes untracked)
    return true;
  }
  auto it = flows_.find(k);
  if (it != flows_.end()) {
    if (s.flags & kFin) it->second |= kGuestFin;
    return true;
  }
  if (overflowed_) return true;  // cannot tell: never a wrong reset

  // Unknown to this backend: the reset RFC 9293 §3.10.7.1 gives a segment of no connection.
  // With ACK: seq = its ack, no ACK. Without: seq 0, ACK of everything it occupies.
  uint32_t seq = be32(s.tcp + 4), ack = be32(s.tcp + 8);
  uint32_t occupies = s.payload + ((s.flags & kSyn) ? 1 : 0) + ((s.flags & kFin) ? 1 : 0);
  reset->assign(kEth + 20 + 20, 0);
  uint8_t* out = reset->data();
  std::memcpy(out, frame + 6, 6);  // to the guest's MAC
  std::memcpy(out + 6, frame, 6);  // from the address it sent to
  put16(out + 12, kEtherIpv4);
  uint8_t* ip = out + kEth;
  ip[0] = 0x45;
  put16(ip + 2, 40);
  put16(ip + 6, 0x4000);  // DF
  ip[8] = 64;
  ip[9] = kProtoTcp;
  std::memcpy(ip + 12, s.ip + 16, 4);
  std::memcpy(ip + 16, s.ip + 12, 4);
  put16(ip + 10, fold(sum16(ip, 20)));
  uint8_t* tcp = ip + 20;
  put16(tcp, k.remote_port);
  put16(tcp + 2, k.guest_port);
  if (s.flags & kAck) {
    put32(tcp + 4, ack);
    tcp[13] = kRst;
  } else {
    put32(tcp + 8, seq + occupies);
    tcp[13] = kRst | kAck;
  }
  tcp[12] = 5 << 4;
  uint32_t pseudo = sum16(ip + 12, 8) + kProtoTcp + 20;
  put16(tcp + 16, fold(sum16(tcp, 20, pseudo)));
  resets_++;
  return false;
}

void TcpFlowTable::backend_sends(const uint8_t* frame, size_t len) {
  Segment s;
  if (!parse(frame, len, &s)) return;
  Key k{};
  std::memcpy(&k.guest_ip, s.ip + 16, 4);
  std::memcpy(&k.remote_ip, s.ip + 12, 4);
  k.guest_port = be16(s.tcp + 2);
  k.remote_port = be16(s.tcp);
  if (s.flags & kRst) {
    flows_.erase(k);
  } else if ((s.flags & kSyn) && !(s.flags & kAck)) {
    add(k);  // a forwarded connection the host opens
  } else if (s.flags & kFin) {
    auto it = flows_.find(k);
    if (it != flows_.end()) it->second |= kRemoteFin;
  }
}

}  // namespace torpor
