#include "devices/virtio/vsock/connection.h"

namespace torpor::vsock {

Connection::Connection(uint32_t local_port, uint32_t peer_port, uint32_t buf_alloc)
    : local_port_(local_port), peer_port_(peer_port), buf_alloc_(buf_alloc) {}

uint32_t Connection::peer_credit() const {
  uint32_t in_flight = tx_cnt_ - peer_fwd_cnt_;  // wraps like the counters
  return in_flight >= peer_buf_alloc_ ? 0 : peer_buf_alloc_ - in_flight;
}

void Connection::stamp(Header& h) {
  h.buf_alloc = buf_alloc_;
  h.fwd_cnt = fwd_cnt_;
  reported_fwd_cnt_ = fwd_cnt_;
}

bool Connection::credit_update_due() const {
  // The guest believes it may send buf_alloc - (rx_cnt - reported_fwd_cnt).
  // Once a quarter of the buffer has been freed unreported, tell it; below
  // that it still has at least 3/4 of the buffer minus what the socket holds
  // back, so it never waits on an update we do not send.
  return fwd_cnt_ - reported_fwd_cnt_ >= buf_alloc_ / 4;
}

uint8_t* Connection::append_pending(uint32_t len) {
  size_t old = pending_.size();
  pending_.resize(old + len);
  rx_cnt_ += len;
  return pending_.data() + old;
}

void Connection::consume_pending(size_t n) {
  if (n > pending_size()) n = pending_size();
  pending_head_ += n;
  fwd_cnt_ += static_cast<uint32_t>(n);
  if (pending_head_ == pending_.size()) {
    pending_.clear();
    pending_head_ = 0;
  } else if (pending_head_ >= 64 * 1024 && pending_head_ * 2 >= pending_.size()) {
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(pending_head_));
    pending_head_ = 0;
  }
}

Connection::Effect Connection::on_guest_packet(const Header& h) {
  peer_buf_alloc_ = h.buf_alloc;
  peer_fwd_cnt_ = h.fwd_cnt;
  switch (state_) {
    case State::kConnecting:
      if (h.op == kOpResponse) {
        state_ = State::kEstablished;
        return Effect::kEstablished;
      }
      if (h.op == kOpRst) {
        state_ = State::kClosed;
        return Effect::kRefused;
      }
      state_ = State::kClosed;
      return Effect::kProtocolError;
    case State::kEstablished:
    case State::kClosing:
      switch (h.op) {
        case kOpRst:
          state_ = State::kClosed;
          return Effect::kPeerReset;
        case kOpRw:
          // Credit: what the guest sent and we still hold must fit our buffer.
          // Data after the guest said it sends no more is a protocol error too.
          if ((guest_shutdown_ & kShutdownSend) || h.len > buf_alloc_ - pending_size()) {
            state_ = State::kClosed;
            return Effect::kProtocolError;
          }
          return h.len == 0 ? Effect::kNone : Effect::kData;
        case kOpShutdown:
          guest_shutdown_ |= h.flags & kShutdownBoth;
          return Effect::kShutdown;
        case kOpCreditUpdate:
          return Effect::kNone;
        case kOpCreditRequest:
          return Effect::kCreditRequest;
        default:  // REQUEST or RESPONSE on a live connection
          state_ = State::kClosed;
          return Effect::kProtocolError;
      }
    case State::kClosed:
      return Effect::kNone;
  }
  return Effect::kNone;
}

}  // namespace torpor::vsock
