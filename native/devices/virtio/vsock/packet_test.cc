#include "devices/virtio/vsock/packet.h"

#include "test/check.h"

using namespace torpor::vsock;

namespace {
Header guest_packet(uint16_t op, uint32_t len = 0) {
  Header h{};
  h.src_cid = 3;
  h.dst_cid = kHostCid;
  h.src_port = 5000;
  h.dst_port = 1024;
  h.type = kTypeStream;
  h.op = op;
  h.len = len;
  return h;
}
}  // namespace

TEST("vsock packet: well-formed packets pass") {
  CHECK(check_tx_packet(guest_packet(kOpResponse), 44, 3) == Verdict::kOk);
  CHECK(check_tx_packet(guest_packet(kOpRw, 100), 144, 3) == Verdict::kOk);
  CHECK(check_tx_packet(guest_packet(kOpRw, kMaxPayload), 44 + kMaxPayload, 3) == Verdict::kOk);
  CHECK(check_tx_packet(guest_packet(kOpCreditRequest), 1000, 3) == Verdict::kOk);
}

TEST("vsock packet: malformed packets are classified") {
  CHECK(check_tx_packet(guest_packet(kOpRw), 43, 3) == Verdict::kShort);
  CHECK(check_tx_packet(guest_packet(kOpRw), 0, 3) == Verdict::kShort);
  Header h = guest_packet(kOpRw);
  h.src_cid = 4;
  CHECK(check_tx_packet(h, 44, 3) == Verdict::kBadSrcCid);
  h = guest_packet(kOpRw);
  h.src_cid = uint64_t{1} << 32 | 3;  // high bits matter
  CHECK(check_tx_packet(h, 44, 3) == Verdict::kBadSrcCid);
  h = guest_packet(kOpRw);
  h.dst_cid = 1;
  CHECK(check_tx_packet(h, 44, 3) == Verdict::kBadDstCid);
  h = guest_packet(kOpRw);
  h.type = 2;  // SEQPACKET
  CHECK(check_tx_packet(h, 44, 3) == Verdict::kBadType);
  CHECK(check_tx_packet(guest_packet(kOpInvalid), 44, 3) == Verdict::kBadOp);
  CHECK(check_tx_packet(guest_packet(8), 44, 3) == Verdict::kBadOp);
  CHECK(check_tx_packet(guest_packet(kOpRw, kMaxPayload + 1), 1 << 20, 3) == Verdict::kOversized);
  CHECK(check_tx_packet(guest_packet(kOpRw, 0xffffffffu), 44, 3) == Verdict::kOversized);
  CHECK(check_tx_packet(guest_packet(kOpRw, 101), 144, 3) == Verdict::kTruncated);
  CHECK(check_tx_packet(guest_packet(kOpShutdown, 4), 48, 3) == Verdict::kStrayPayload);
  for (int v = 0; v <= static_cast<int>(Verdict::kStrayPayload); v++)
    CHECK(verdict_name(static_cast<Verdict>(v))[0] != '?');
}

TEST("vsock packet: host headers") {
  Header h = host_header(7, 1024, 5000, kOpRequest);
  CHECK_EQ(h.src_cid, kHostCid);
  CHECK_EQ(h.dst_cid, uint64_t{7});
  CHECK_EQ(h.src_port, 1024u);
  CHECK_EQ(h.dst_port, 5000u);
  CHECK_EQ(h.type, kTypeStream);
  CHECK_EQ(h.op, static_cast<uint16_t>(kOpRequest));
  CHECK_EQ(h.len, 0u);
  CHECK(std::string(op_name(kOpCreditUpdate)) == "CREDIT_UPDATE");
}
