// One host-initiated vsock stream connection, as pure logic: its state, its
// credit accounting in both directions and the bytes the guest sent that
// are not yet written to the host's socket. The device (vsock_device.h) does
// the I/O and follows the decisions made here.
//
// Credit (virtio 1.2 §5.10.6.3): each side advertises buf_alloc (its receive
// buffer) and fwd_cnt (bytes it has consumed from it) on every packet. A
// sender may have at most peer_buf_alloc - (tx_cnt - peer_fwd_cnt) bytes in
// flight. Counters are free-running u32 and wrap.
//   Host -> guest: peer_credit() bounds what the device reads from the socket.
//   Guest -> host: our buf_alloc bounds `pending` (received, not yet written to
//   the socket); fwd_cnt advances as bytes reach the socket; a guest that
//   sends past its credit is reset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "devices/virtio/vsock/packet.h"

namespace torpor::vsock {

class Connection {
 public:
  enum class State {
    kConnecting,   // REQUEST queued or sent, waiting for RESPONSE
    kEstablished,  // data flows
    kClosing,      // the host closed its end: SHUTDOWN sent, waiting for the guest's RST
    kClosed,       // gone: the device drops it
  };

  // What the device must do after a packet from the guest.
  enum class Effect {
    kNone,          // counters updated; nothing else
    kEstablished,   // RESPONSE to our REQUEST: create the socketpair, call done
    kRefused,       // RST to our REQUEST
    kPeerReset,     // RST on a live connection: drop it, no answer
    kProtocolError, // the guest broke the protocol (or its credit): answer RST, drop
    kData,          // RW accepted: copy `len` payload bytes into append_pending()
    kShutdown,      // the guest shut down one or both directions (guest_shutdown())
    kCreditRequest, // answer with CREDIT_UPDATE
  };

  // Our receive buffer for guest data not yet on the socket.
  static constexpr uint32_t kDefaultBufAlloc = 256 * 1024;

  Connection(uint32_t local_port, uint32_t peer_port, uint32_t buf_alloc = kDefaultBufAlloc);

  uint32_t local_port() const { return local_port_; }
  uint32_t peer_port() const { return peer_port_; }
  State state() const { return state_; }

  // A packet from the guest for this connection (already validated by
  // check_tx_packet and matched on ports). Updates the peer's credit.
  Effect on_guest_packet(const Header& h);
  // The host end was closed: we send SHUTDOWN (both) and wait for RST.
  void host_closed() { if (state_ == State::kEstablished) state_ = State::kClosing; }
  void close() { state_ = State::kClosed; }

  // --- host -> guest
  uint32_t peer_credit() const;
  void sent_to_guest(uint32_t n) { tx_cnt_ += n; }
  // buf_alloc and fwd_cnt for a header we are about to send.
  void stamp(Header& h);

  // --- guest -> host
  // Where the payload of the RW packet just accepted (Effect::kData) goes.
  uint8_t* append_pending(uint32_t len);
  const uint8_t* pending_data() const { return pending_.data() + pending_head_; }
  size_t pending_size() const { return pending_.size() - pending_head_; }
  // n bytes reached the socket.
  void consume_pending(size_t n);
  // True when the guest's idea of our free space lags enough that it may
  // stall: send a CREDIT_UPDATE.
  bool credit_update_due() const;
  uint32_t buf_alloc() const { return buf_alloc_; }
  uint32_t fwd_cnt() const { return fwd_cnt_; }

  // What the guest has shut down (kShutdownRcv: it takes no more data;
  // kShutdownSend: it sends no more).
  uint32_t guest_shutdown() const { return guest_shutdown_; }

 private:
  uint32_t local_port_;
  uint32_t peer_port_;
  State state_ = State::kConnecting;

  uint32_t buf_alloc_;
  uint32_t fwd_cnt_ = 0;           // bytes of guest data written to the socket
  uint32_t rx_cnt_ = 0;            // bytes of guest data received
  uint32_t reported_fwd_cnt_ = 0;  // fwd_cnt in the last header we sent
  std::vector<uint8_t> pending_;
  size_t pending_head_ = 0;

  uint32_t peer_buf_alloc_ = 0;
  uint32_t peer_fwd_cnt_ = 0;
  uint32_t tx_cnt_ = 0;            // bytes of host data sent to the guest

  uint32_t guest_shutdown_ = 0;
};

}  // namespace torpor::vsock
