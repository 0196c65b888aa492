// The TCP flow table on hand-built segments: flows opened since the backend was attached pass;
// a segment of any other flow (one the guest opened before a pause) is held back and answered
// with a well-formed RST the guest's stack accepts (seq = the segment's ack, checksums right).
#include "devices/virtio/net/tcp_flows.h"

#include <arpa/inet.h>

#include <cstring>
#include <vector>

#include "test/check.h"

using namespace torpor;

namespace {

constexpr uint8_t kFin = 0x01, kSyn = 0x02, kRst = 0x04, kPsh = 0x08, kAck = 0x10;
const uint8_t kGuestMac[6] = {0x02, 0x11, 0x22, 0x33, 0x44, 0x55};
const uint8_t kGatewayMac[6] = {0x9a, 0x55, 0x9a, 0x55, 0x9a, 0x55};

uint16_t be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
uint32_t be32(const uint8_t* p) { return uint32_t{be16(p)} << 16 | be16(p + 2); }

// One's-complement sum over the bytes: 0xffff for a header whose checksum is right.
uint16_t ones_sum(const uint8_t* p, size_t len, uint32_t sum = 0) {
  for (size_t i = 0; i + 1 < len; i += 2) sum += be16(p + i);
  if (len & 1) sum += uint32_t{p[len - 1]} << 8;
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

// An IPv4 TCP segment from `src`:sport to `dst`:dport with `payload` bytes.
std::vector<uint8_t> segment(const char* src, uint16_t sport, const char* dst, uint16_t dport, uint8_t flags,
                             uint32_t seq, uint32_t ack, size_t payload = 0, bool from_guest = true) {
  std::vector<uint8_t> f(14 + 20 + 20 + payload, 0);
  std::memcpy(f.data(), from_guest ? kGatewayMac : kGuestMac, 6);
  std::memcpy(f.data() + 6, from_guest ? kGuestMac : kGatewayMac, 6);
  f[12] = 0x08;
  uint8_t* ip = f.data() + 14;
  ip[0] = 0x45;
  size_t total = 40 + payload;
  ip[2] = static_cast<uint8_t>(total >> 8);
  ip[3] = static_cast<uint8_t>(total);
  ip[8] = 64;
  ip[9] = 6;
  inet_pton(AF_INET, src, ip + 12);
  inet_pton(AF_INET, dst, ip + 16);
  uint8_t* tcp = ip + 20;
  tcp[0] = static_cast<uint8_t>(sport >> 8);
  tcp[1] = static_cast<uint8_t>(sport);
  tcp[2] = static_cast<uint8_t>(dport >> 8);
  tcp[3] = static_cast<uint8_t>(dport);
  for (int i = 0; i < 4; i++) {
    tcp[4 + i] = static_cast<uint8_t>(seq >> (24 - 8 * i));
    tcp[8 + i] = static_cast<uint8_t>(ack >> (24 - 8 * i));
  }
  tcp[12] = 5 << 4;
  tcp[13] = flags;
  return f;
}

std::vector<uint8_t> from_guest(uint16_t sport, uint8_t flags, uint32_t seq = 1000, uint32_t ack = 5000, size_t payload = 0) {
  return segment("10.0.2.15", sport, "192.0.2.7", 80, flags, seq, ack, payload, true);
}

bool sends(TcpFlowTable& t, const std::vector<uint8_t>& f, std::vector<uint8_t>* reset = nullptr) {
  std::vector<uint8_t> r;
  bool ok = t.guest_sends(f.data(), f.size(), reset ? reset : &r);
  return ok;
}

}  // namespace

TEST("tcp flows: a flow the guest opens since the backend was attached passes, both ways, to its end") {
  TcpFlowTable t;
  CHECK(sends(t, from_guest(40000, kSyn)));
  CHECK_EQ(t.size(), size_t{1});
  CHECK(sends(t, from_guest(40000, kAck)));
  CHECK(sends(t, from_guest(40000, kAck | kPsh, 1001, 5001, 100)));
  CHECK(sends(t, from_guest(40000, kAck | kFin)));
  auto fin = segment("192.0.2.7", 80, "10.0.2.15", 40000, kAck | kFin, 5001, 1102, 0, false);
  t.backend_sends(fin.data(), fin.size());
  CHECK(sends(t, from_guest(40000, kAck)));  // the last ACK after both FINs
  CHECK_EQ(t.resets(), uint64_t{0});
  // The same ports again: a live flow, not one that ended (a full table evicts only those).
  CHECK(sends(t, from_guest(40000, kSyn)));
  for (uint32_t i = 1; i < TcpFlowTable::kMaxFlows; i++) CHECK(sends(t, from_guest(static_cast<uint16_t>(i), kSyn)));
  CHECK(sends(t, from_guest(50000, kSyn)));  // no room, nothing ended: untracked
  CHECK(sends(t, from_guest(40000, kAck)));
  t.clear();
  CHECK(sends(t, from_guest(40000, kSyn)));
  CHECK(sends(t, from_guest(40000, kFin | kAck)));
  t.backend_sends(fin.data(), fin.size());
  for (uint32_t i = 1; i < TcpFlowTable::kMaxFlows; i++) CHECK(sends(t, from_guest(static_cast<uint16_t>(i), kSyn)));
  CHECK(sends(t, from_guest(50000, kSyn)));  // room made from the ended flow
  CHECK(!sends(t, from_guest(40000, kAck)));  // which is gone: a reset
  CHECK_EQ(t.resets(), uint64_t{1});
  t.clear();
  // An RST from the guest ends the flow.
  CHECK(sends(t, from_guest(40001, kSyn)));
  CHECK(sends(t, from_guest(40001, kRst)));
  CHECK_EQ(t.size(), size_t{0});
}

TEST("tcp flows: a forwarded connection (the backend's SYN) passes; the backend's RST ends it") {
  TcpFlowTable t;
  auto syn = segment("10.0.2.2", 51000, "10.0.2.15", 8080, kSyn, 7, 0, 0, false);
  t.backend_sends(syn.data(), syn.size());
  auto synack = segment("10.0.2.15", 8080, "10.0.2.2", 51000, kSyn | kAck, 300, 8);
  CHECK(sends(t, synack));
  auto rst = segment("10.0.2.2", 51000, "10.0.2.15", 8080, kRst, 8, 0, 0, false);
  t.backend_sends(rst.data(), rst.size());
  CHECK_EQ(t.size(), size_t{0});
}

TEST("tcp flows: a segment of a flow the backend does not know gets an RST the guest accepts") {
  TcpFlowTable t;
  CHECK(sends(t, from_guest(40000, kSyn)));
  t.clear();  // a new backend (after a restore)
  std::vector<uint8_t> rst;
  auto seg = from_guest(40000, kAck | kPsh, 0x11223344, 0x55667788, 6);
  CHECK(!sends(t, seg, &rst));
  CHECK_EQ(t.resets(), uint64_t{1});
  CHECK_EQ(rst.size(), size_t{54});
  CHECK(std::memcmp(rst.data(), kGuestMac, 6) == 0);
  CHECK(std::memcmp(rst.data() + 6, kGatewayMac, 6) == 0);
  CHECK_EQ(be16(rst.data() + 12), uint16_t{0x0800});
  const uint8_t* ip = rst.data() + 14;
  CHECK_EQ(ones_sum(ip, 20), uint16_t{0xffff});
  CHECK(std::memcmp(ip + 12, seg.data() + 14 + 16, 4) == 0);  // from the remote
  CHECK(std::memcmp(ip + 16, seg.data() + 14 + 12, 4) == 0);  // to the guest
  const uint8_t* tcp = ip + 20;
  CHECK_EQ(be16(tcp), uint16_t{80});
  CHECK_EQ(be16(tcp + 2), uint16_t{40000});
  CHECK_EQ(be32(tcp + 4), uint32_t{0x55667788});  // seq = the segment's ack: exactly RCV.NXT
  CHECK_EQ(tcp[13], kRst);
  uint32_t pseudo = be16(ip + 12) + be16(ip + 14) + be16(ip + 16) + be16(ip + 18) + 6 + 20;
  CHECK_EQ(ones_sum(tcp, 20, pseudo), uint16_t{0xffff});
  // Without ACK: seq 0, RST+ACK acknowledging what the segment occupied (payload and FIN).
  CHECK(!sends(t, from_guest(40002, kFin, 100, 0, 10), &rst));
  CHECK_EQ(rst[14 + 20 + 13], uint8_t{kRst | kAck});
  CHECK_EQ(be32(rst.data() + 14 + 20 + 8), uint32_t{111});
  // The guest's own RST of an unknown flow just passes.
  CHECK(sends(t, from_guest(40003, kRst)));
}

TEST("tcp flows: not plain IPv4 TCP passes untouched; a full table never resets") {
  TcpFlowTable t;
  auto seg = from_guest(40000, kAck);
  for (size_t len = 0; len < seg.size(); len++) CHECK(sends(t, std::vector<uint8_t>(seg.begin(), seg.begin() + len)));
  auto frag = seg;
  frag[14 + 6] = 0x20;  // more fragments
  CHECK(sends(t, frag));
  auto udp = seg;
  udp[14 + 9] = 17;
  CHECK(sends(t, udp));
  auto lying = seg;
  lying[14 + 3] = 200;  // an IP total length beyond the frame
  CHECK(sends(t, lying));
  auto v6 = seg;
  v6[12] = 0x86;
  v6[13] = 0xdd;
  CHECK(sends(t, v6));
  CHECK_EQ(t.resets(), uint64_t{0});
  for (uint32_t i = 0; i < TcpFlowTable::kMaxFlows + 1; i++) {
    auto syn = segment("10.0.2.15", static_cast<uint16_t>(1024 + i), "192.0.2.7", 80, kSyn, 0, 0);
    CHECK(sends(t, syn));
  }
  CHECK_EQ(t.size(), TcpFlowTable::kMaxFlows);
  CHECK(sends(t, from_guest(65000, kAck)));  // untracked flows exist: no reset from here on
  t.clear();
  CHECK(!sends(t, from_guest(65000, kAck)));
}
