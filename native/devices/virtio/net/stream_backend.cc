#include "devices/virtio/net/stream_backend.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "devices/virtio/net/stream_frame.h"

namespace torpor {

namespace {
// Reads per callback at most, so one busy sandbox cannot hold the I/O thread.
constexpr int kReadsPerCallback = 8;
}  // namespace

StreamBackend::StreamBackend(EventLoop& loop, std::mutex& lock, VirtioNetDevice& device, Fd fd)
    : loop_(loop), lock_(lock), device_(device), fd_(std::move(fd)), in_(kReadBuffer) {
  if (!fd_.valid()) throw Error(code::kNetBackend, "network backend: no socket");
  int flags = fcntl(fd_.get(), F_GETFL);
  if (flags < 0 || fcntl(fd_.get(), F_SETFL, flags | O_NONBLOCK) < 0)
    throw_sys_error(code::kNetBackend, "network backend: fcntl(O_NONBLOCK)");
}

StreamBackend::~StreamBackend() {
  bool was_registered;
  {
    std::lock_guard<std::mutex> lock(lock_);
    if (attached_) device_.set_backend(nullptr);
    attached_ = false;
    was_registered = registered_;
    registered_ = false;
  }
  if (was_registered) loop_.remove(fd_.get());
}

void StreamBackend::start() {
  armed_ = uint32_t{EPOLLIN};
  if (!loop_.add(fd_.get(), armed_, [this](uint32_t ev) { on_events(ev); }))
    throw_sys_error(code::kNetBackend, "network backend: epoll refused the socket");
  std::lock_guard<std::mutex> lock(lock_);
  registered_ = true;
  attached_ = true;
  device_.set_backend(this);
}

bool StreamBackend::can_send() const { return dead_ || out_.size() - out_off_ < kOutLimit; }

void StreamBackend::send(const uint8_t* frame, size_t len) {
  if (dead_) return;
  if (out_off_ == out_.size()) {
    out_.clear();
    out_off_ = 0;
  }
  size_t at = out_.size();
  out_.resize(at + net_stream::kLengthBytes + len);
  net_stream::put_length(out_.data() + at, static_cast<uint32_t>(len));
  std::memcpy(out_.data() + at + net_stream::kLengthBytes, frame, len);
  stats_.frames_out++;
  stats_.bytes_out += len;
  if (!flush_out()) return;
  rearm();
}

void StreamBackend::rx_ready() {
  if (dead_ || !rx_paused_) return;
  if (!deliver()) return;  // still refused: wait for the next rx_ready()
  rx_paused_ = false;
  rearm();
}

bool StreamBackend::deliver() {
  bool taken = true;
  while (true) {
    size_t len = 0;
    auto st = net_stream::next_frame(in_.data() + in_off_, in_len_ - in_off_, virtio_net::kMaxFrameLen, &len);
    if (st == net_stream::Parse::kNeedMore) break;
    if (st == net_stream::Parse::kBad) {
      die("the network backend sent a frame length of 0 or above 65553 bytes");
      return false;
    }
    if (!device_.receive(in_.data() + in_off_ + net_stream::kLengthBytes, len)) {
      taken = false;
      break;
    }
    in_off_ += net_stream::kLengthBytes + len;
    stats_.frames_in++;
    stats_.bytes_in += len;
  }
  device_.end_rx_batch();
  if (in_off_ == in_len_) in_off_ = in_len_ = 0;
  return taken;
}

bool StreamBackend::read_some() {
  for (int i = 0; i < kReadsPerCallback; i++) {
    if (in_off_ > 0) {
      std::memmove(in_.data(), in_.data() + in_off_, in_len_ - in_off_);
      in_len_ -= in_off_;
      in_off_ = 0;
    }
    size_t room = in_.size() - in_len_;
    if (room == 0) return true;  // cannot happen: a whole frame always fits (kBad otherwise)
    ssize_t n = ::recv(fd_.get(), in_.data() + in_len_, room, MSG_DONTWAIT);
    if (n == 0) {
      die("the network backend closed its socket");
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      die(std::string("reading from the network backend: ") + std::strerror(errno));
      return false;
    }
    in_len_ += static_cast<size_t>(n);
    if (!deliver()) {
      if (!dead_) rx_paused_ = true;
      return !dead_;
    }
    if (static_cast<size_t>(n) < room) return true;  // the socket is drained
  }
  return true;
}

// One send per frame (its length and bytes together), never several frames in one: passt
// (Debian's 2023 build) reads the stream expecting every read to end on a frame boundary, or
// at most one frame short, which it then completes with a single blocking read; a read that
// ends inside a length prefix, or a remainder that arrives in two pieces, loses its place in
// the stream for good (it parses frame bytes as lengths from then on: the bulk-transfer hang
// of docs/network.md). The kernel queues a send of one frame as one unit, whole or not at all
// when the socket is full, so the peer never sees part of a frame; one send of many frames is
// cut into pieces at arbitrary bytes. Only a frame larger than one socket buffer unit (about
// 32 KiB, never with a 1500-byte MTU) can still arrive in pieces; it is finished before any
// other frame is sent.
bool StreamBackend::flush_out() {
  while (out_off_ < out_.size()) {
    size_t len = out_frame_left_;
    if (len == 0) {
      // out_ holds whole records from out_off_ on: read the next one's length.
      const uint8_t* at = out_.data() + out_off_;
      len = net_stream::kLengthBytes + ((size_t{at[0]} << 24) | (size_t{at[1]} << 16) | (size_t{at[2]} << 8) | size_t{at[3]});
    }
    ssize_t n = ::send(fd_.get(), out_.data() + out_off_, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      die(std::string("writing to the network backend: ") + std::strerror(errno));
      return false;
    }
    out_off_ += static_cast<size_t>(n);
    out_frame_left_ = len - static_cast<size_t>(n);
  }
  if (out_off_ == out_.size()) {
    out_.clear();
    out_off_ = 0;
  } else if (out_off_ > kOutLimit) {
    out_.erase(out_.begin(), out_.begin() + static_cast<ptrdiff_t>(out_off_));
    out_off_ = 0;
  }
  return true;
}

void StreamBackend::rearm() {
  if (!registered_) return;
  uint32_t want = 0;
  if (!dead_) {
    if (!rx_paused_) want |= EPOLLIN;
    if (out_off_ < out_.size()) want |= EPOLLOUT;
  }
  if (want == armed_) return;
  armed_ = want;
  loop_.modify(fd_.get(), want);
}

void StreamBackend::die(const std::string& why) {
  if (dead_) return;
  dead_ = true;
  error_ = why;
  out_.clear();
  out_off_ = 0;
  out_frame_left_ = 0;
  in_off_ = in_len_ = 0;
  if (attached_) {
    attached_ = false;
    device_.set_backend(nullptr);  // link down; tx chains are dropped from now on
  }
  rearm();
}

void StreamBackend::on_events(uint32_t events) {
  std::lock_guard<std::mutex> lock(lock_);
  if (!registered_) return;
  if (!dead_) {
    if (events & EPOLLOUT) {
      bool was_full = !can_send();
      if (flush_out() && was_full && can_send()) device_.tx_ready();
    }
    if (!dead_ && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !rx_paused_) read_some();
    if (!dead_ && (events & (EPOLLHUP | EPOLLERR)) && rx_paused_) die("the network backend hung up");
  }
  if (dead_) {
    // Only here, on the I/O thread, may the socket leave the loop (remove()
    // from inside its own callback does not wait).
    registered_ = false;
    loop_.remove(fd_.get());
    return;
  }
  rearm();
}

}  // namespace torpor
