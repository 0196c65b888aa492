#include "devices/virtio/vsock/connection.h"

#include <cstring>

#include "test/check.h"

using namespace torpor::vsock;
using State = Connection::State;
using Effect = Connection::Effect;

namespace {
Header from_guest(uint16_t op, uint32_t len = 0, uint32_t buf_alloc = 4096, uint32_t fwd_cnt = 0, uint32_t flags = 0) {
  Header h{};
  h.src_cid = 3;
  h.dst_cid = kHostCid;
  h.src_port = 5000;
  h.dst_port = 1024;
  h.type = kTypeStream;
  h.op = op;
  h.len = len;
  h.buf_alloc = buf_alloc;
  h.fwd_cnt = fwd_cnt;
  h.flags = flags;
  return h;
}
Connection established(uint32_t buf_alloc = 1000, uint32_t peer_buf = 4096) {
  Connection c(1024, 5000, buf_alloc);
  Effect e = c.on_guest_packet(from_guest(kOpResponse, 0, peer_buf));
  if (e != Effect::kEstablished) throw std::runtime_error("not established");
  return c;
}
}  // namespace

TEST("vsock connection: REQUEST answered by RESPONSE, RST or nonsense") {
  Connection a(1024, 5000);
  CHECK(a.state() == State::kConnecting);
  CHECK(a.on_guest_packet(from_guest(kOpResponse)) == Effect::kEstablished);
  CHECK(a.state() == State::kEstablished);
  Connection b(1024, 5000);
  CHECK(b.on_guest_packet(from_guest(kOpRst)) == Effect::kRefused);
  CHECK(b.state() == State::kClosed);
  Connection c(1024, 5000);
  CHECK(c.on_guest_packet(from_guest(kOpRw, 4)) == Effect::kProtocolError);
  CHECK(c.state() == State::kClosed);
  Connection d = established();
  CHECK(d.on_guest_packet(from_guest(kOpResponse)) == Effect::kProtocolError);
  Connection e = established();
  CHECK(e.on_guest_packet(from_guest(kOpRequest)) == Effect::kProtocolError);
  Connection f = established();
  CHECK(f.on_guest_packet(from_guest(kOpRst)) == Effect::kPeerReset);
  CHECK(f.state() == State::kClosed);
}

TEST("vsock connection: peer credit from buf_alloc/fwd_cnt, with wraparound") {
  Connection c = established(1000, 4096);
  CHECK_EQ(c.peer_credit(), 4096u);
  c.sent_to_guest(4000);
  CHECK_EQ(c.peer_credit(), 96u);
  c.sent_to_guest(96);
  CHECK_EQ(c.peer_credit(), 0u);
  CHECK(c.on_guest_packet(from_guest(kOpCreditUpdate, 0, 4096, 1000)) == Effect::kNone);
  CHECK_EQ(c.peer_credit(), 1000u);
  // A peer shrinking its buffer below what is in flight: no credit, no underflow.
  c.on_guest_packet(from_guest(kOpCreditUpdate, 0, 100, 1000));
  CHECK_EQ(c.peer_credit(), 0u);
  // Counters wrap at 2^32.
  Connection w = established(1000, 8192);
  w.sent_to_guest(0xfffff000u);
  w.on_guest_packet(from_guest(kOpCreditUpdate, 0, 8192, 0xfffff000u));
  CHECK_EQ(w.peer_credit(), 8192u);
  w.sent_to_guest(0x2000);  // tx_cnt wraps to 0x1000
  CHECK_EQ(w.peer_credit(), 0u);
  w.on_guest_packet(from_guest(kOpCreditUpdate, 0, 8192, 0x1000));
  CHECK_EQ(w.peer_credit(), 8192u);
  CHECK(w.on_guest_packet(from_guest(kOpCreditRequest)) == Effect::kCreditRequest);
}

TEST("vsock connection: guest data within our buf_alloc, fwd_cnt and credit updates") {
  Connection c = established(1000);
  Header out{};
  c.stamp(out);
  CHECK_EQ(out.buf_alloc, 1000u);
  CHECK_EQ(out.fwd_cnt, 0u);
  CHECK(c.on_guest_packet(from_guest(kOpRw, 600)) == Effect::kData);
  std::memset(c.append_pending(600), 'a', 600);
  CHECK_EQ(c.pending_size(), size_t{600});
  CHECK(c.on_guest_packet(from_guest(kOpRw, 0)) == Effect::kNone);
  CHECK(c.on_guest_packet(from_guest(kOpRw, 400)) == Effect::kData);
  std::memset(c.append_pending(400), 'b', 400);
  CHECK_EQ(c.pending_data()[599], 'a');
  CHECK_EQ(c.pending_data()[600], 'b');
  c.consume_pending(200);
  CHECK_EQ(c.fwd_cnt(), 200u);
  CHECK(!c.credit_update_due());  // < buf_alloc/4 unreported
  c.consume_pending(100);
  CHECK(c.credit_update_due());
  c.stamp(out);
  CHECK_EQ(out.fwd_cnt, 300u);
  CHECK(!c.credit_update_due());
  CHECK_EQ(c.pending_data()[0], 'a');
  CHECK_EQ(c.pending_size(), size_t{700});
  // 700 held: 300 free. 301 is past the credit: the guest broke the protocol.
  CHECK(c.on_guest_packet(from_guest(kOpRw, 301)) == Effect::kProtocolError);
  CHECK(c.state() == State::kClosed);
  c.consume_pending(10000);  // more than held: clamps
  CHECK_EQ(c.pending_size(), size_t{0});
  CHECK_EQ(c.fwd_cnt(), 1000u);
}

TEST("vsock connection: shutdown flags, data after SHUTDOWN(SEND), host close") {
  Connection c = established();
  CHECK(c.on_guest_packet(from_guest(kOpShutdown, 0, 4096, 0, kShutdownRcv)) == Effect::kShutdown);
  CHECK_EQ(c.guest_shutdown(), kShutdownRcv);
  CHECK(c.on_guest_packet(from_guest(kOpShutdown, 0, 4096, 0, kShutdownSend | 0x10)) == Effect::kShutdown);
  CHECK_EQ(c.guest_shutdown(), kShutdownBoth);  // unknown flag bits ignored
  CHECK(c.on_guest_packet(from_guest(kOpRw, 1)) == Effect::kProtocolError);
  Connection h = established();
  h.host_closed();
  CHECK(h.state() == State::kClosing);
  CHECK(h.on_guest_packet(from_guest(kOpRst)) == Effect::kPeerReset);
  Connection k(1024, 5000);
  k.host_closed();  // not established: nothing to close yet
  CHECK(k.state() == State::kConnecting);
}
