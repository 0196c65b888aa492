#include "devices/virtio/vsock/vsock_device.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "common/error.h"
#include "devices/virtio/serve_queue.h"

namespace torpor {

using vsock::Connection;
using vsock::Header;
using State = vsock::Connection::State;
using Effect = vsock::Connection::Effect;

namespace {
constexpr const char* kStateTag = "virtio-vsock";
constexpr uint32_t kStateVersion = 1;
constexpr uint32_t kFirstPort = 1024;  // below are "privileged" on Linux; we never bind them
constexpr size_t kMaxKnockPorts = 16;
constexpr uint32_t kLastPort = 0x7fffffff;
// While a REQUEST is held back after a transport reset, look at the event
// queue this often (the guest may re-post its buffer without a kick).
constexpr auto kRefillPoll = std::chrono::milliseconds(2);
}  // namespace

VsockDevice::VsockDevice(GuestMemory& mem, EventLoop& loop, uint64_t guest_cid)
    : mem_(mem), loop_(loop), life_(std::make_shared<Life>()), guest_cid_(guest_cid), scratch_(vsock::kMaxPayload) {
  precondition(guest_cid >= vsock::kMinGuestCid && guest_cid <= vsock::kMaxGuestCid, "vsock guest CID in 3..0xfffffffe");
  life_->dev = this;
  timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer_fd_ < 0) throw_sys_error(code::kInternal, "vsock: timerfd_create");
  std::shared_ptr<Life> life = life_;
  if (!loop_.add(timer_fd_, EPOLLIN, [life](uint32_t) {
        std::lock_guard<std::mutex> g(life->mu);
        if (life->dev) life->dev->on_timer();
      })) {
    int e = errno;
    close(timer_fd_);
    throw_sys_error(code::kInternal, "vsock: epoll add timerfd", e);
  }
}

VsockDevice::~VsockDevice() { detach(); }

void VsockDevice::detach() {
  {
    std::lock_guard<std::mutex> g(life_->mu);
    if (!life_->dev) return;
    life_->dev = nullptr;
  }
  // From here no socket/timer callback or closure of ours touches the device.
  // A notification the transport posted may still arrive: detached_ turns it
  // into a no-op. The descriptors are released outside the transport's lock,
  // because EventLoop::remove() may wait for a callback that wants that lock.
  std::map<uint32_t, std::unique_ptr<Conn>> conns;
  if (transport_) {
    std::lock_guard<std::mutex> lock(transport_->lock());
    detached_ = true;
    conns.swap(conns_);
    control_.clear();
  } else {
    detached_ = true;
    conns.swap(conns_);
  }
  for (auto& [port, c] : conns) {
    if (c->fd >= 0) {
      loop_.remove(c->fd);
      close(c->fd);
    }
    if (c->done) complete(std::move(c->done), -1, code::kVsockRefused, "the machine stopped");
  }
  loop_.remove(timer_fd_);
  close(timer_fd_);
  timer_fd_ = -1;
}

// ---------------------------------------------------------------- config, lifecycle

void VsockDevice::read_config(uint64_t offset, uint8_t* data, size_t len) {
  uint8_t cfg[8];
  std::memcpy(cfg, &guest_cid_, sizeof cfg);  // le64 guest_cid
  for (size_t i = 0; i < len; i++) data[i] = offset + i < sizeof cfg ? cfg[offset + i] : 0;
}

void VsockDevice::activate() {
  process_tx();
  pump();
}

void VsockDevice::queue_notify(uint32_t index) {
  if (index == kTxQueue) process_tx();
  pump();  // rx: new buffers; event: a buffer for a pending reset event
}

void VsockDevice::reset() {
  // Connections whose REQUEST never reached the guest survive: a driver
  // resets the device while it probes, and connect() may precede that.
  drop_all(code::kVsockRefused, "the guest's vsock driver reset the device", true);
  reset_event_pending_ = false;
  awaiting_event_refill_ = false;
  tx_stalled_ = false;
  arm_timer();
}

void VsockDevice::save(StateWriter& out) const {
  out.header(kStateTag, kStateVersion);
  out.u64(guest_cid_);
  out.u32(next_port_);
}

void VsockDevice::restore(StateReader& in) {
  in.expect_header(kStateTag, kStateVersion, kStateVersion);
  uint64_t cid = in.u64();
  uint32_t port = in.u32();
  if (cid < vsock::kMinGuestCid || cid > vsock::kMaxGuestCid) StateReader::fail("vsock: bad guest CID");
  if (port < kFirstPort || port > kLastPort) StateReader::fail("vsock: bad next port");
  // The guest read its CID from config space before the capture: keep it.
  guest_cid_ = cid;
  next_port_ = port;
  drop_all(code::kVsockRefused, "the machine was restored", false);
  control_.clear();
}

void VsockDevice::quiesce() {
  if (quiesced_) return;
  quiesced_ = true;
  // EPOLLONESHOT registrations that have not fired yet would only note the
  // event (on_socket), but disarm them anyway: nothing of ours runs while
  // the machine is paused. A disarmed fd is re-armed by unquiesce()'s pump.
  for (auto& [port, c] : conns_) {
    if (c->fd >= 0 && c->armed_events != 0) {
      loop_.modify(c->fd, EPOLLONESHOT);
      c->armed_events = 0;
    }
  }
  if (timer_fd_ >= 0) {
    itimerspec off{};
    timerfd_settime(timer_fd_, 0, &off, nullptr);
    timer_set_ = Clock::time_point::max();
  }
}

void VsockDevice::unquiesce() {
  if (!quiesced_) return;
  quiesced_ = false;
  // rearm() asks epoll again for whatever each connection waits for: data
  // that arrived meanwhile fires at once. Deadlines that passed fire the timer.
  pump();
}

VsockStats VsockDevice::stats() const {
  std::lock_guard<std::mutex> lock(transport_->lock());
  VsockStats s = stats_;
  s.live = conns_.size();
  return s;
}

// ---------------------------------------------------------------- host API

void VsockDevice::connect(uint32_t port, uint32_t timeout_ms, Done done) {
  std::shared_ptr<Life> life = life_;
  auto shared_done = std::make_shared<Done>(std::move(done));
  bool posted = loop_.post([life, port, timeout_ms, shared_done] {
    std::lock_guard<std::mutex> g(life->mu);
    if (life->dev)
      life->dev->start_connect(port, timeout_ms, std::move(*shared_done));
    else
      (*shared_done)(-1, code::kVsockRefused, "the machine stopped");
  });
  if (!posted) (*shared_done)(-1, code::kVsockRefused, "the machine's I/O thread is stopped");
}

void VsockDevice::transport_reset() {
  std::shared_ptr<Life> life = life_;
  loop_.post([life] {
    std::lock_guard<std::mutex> g(life->mu);
    if (life->dev) life->dev->do_transport_reset();
  });
}

void VsockDevice::schedule_pump() {
  if (pump_scheduled_) return;
  std::shared_ptr<Life> life = life_;
  pump_scheduled_ = loop_.post([life] {
    std::lock_guard<std::mutex> g(life->mu);
    if (!life->dev) return;
    std::lock_guard<std::mutex> lock(life->dev->transport_->lock());
    life->dev->pump_scheduled_ = false;
    life->dev->pump();
  });
}

void VsockDevice::start_connect(uint32_t port, uint32_t timeout_ms, Done done) {
  std::lock_guard<std::mutex> lock(transport_->lock());
  uint32_t local = allocate_port();
  auto c = std::make_unique<Conn>(local, port);
  c->done = std::move(done);
  if (timeout_ms) c->deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  conns_[local] = std::move(c);
  queue_control(local, port, vsock::kOpRequest);
  pump();
}

void VsockDevice::do_transport_reset() {
  std::lock_guard<std::mutex> lock(transport_->lock());
  drop_all(code::kVsockRefused, "vsock transport reset", false);
  control_.clear();
  tx_stalled_ = false;
  // Without a running driver there is nothing on the guest's side to reset.
  if (transport_->active()) reset_event_pending_ = true;
  pump();
}

void VsockDevice::set_knock_ports(const std::vector<uint32_t>& ports, std::function<void()> knocked) {
  precondition(ports.size() <= kMaxKnockPorts, "at most 16 vsock knock ports");
  for (uint32_t p : ports) precondition(p != 0 && p < kFirstPort, "vsock knock ports in 1..1023");
  std::lock_guard<std::mutex> lock(transport_->lock());
  knocks_.clear();
  for (uint32_t p : ports) knocks_[p] = 0;
  knocked_ = std::move(knocked);
}

std::vector<std::pair<uint32_t, uint64_t>> VsockDevice::knocks() const {
  std::lock_guard<std::mutex> lock(transport_->lock());
  return {knocks_.begin(), knocks_.end()};
}

void VsockDevice::note_knock(uint32_t port) {
  auto it = knocks_.find(port);
  if (it == knocks_.end()) return;
  it->second++;
  stats_.knocks++;
  if (!knocked_ || knock_report_posted_) return;  // the report on its way covers this knock too
  std::shared_ptr<Life> life = life_;
  knock_report_posted_ = loop_.post([life] {
    std::function<void()> report;
    {
      std::lock_guard<std::mutex> g(life->mu);
      if (!life->dev) return;
      std::lock_guard<std::mutex> lock(life->dev->transport_->lock());
      life->dev->knock_report_posted_ = false;
      report = life->dev->knocked_;
    }
    if (report) report();
  });
}

uint32_t VsockDevice::allocate_port() {
  for (;;) {
    uint32_t p = next_port_;
    next_port_ = next_port_ >= kLastPort ? kFirstPort : next_port_ + 1;
    if (!conns_.count(p)) return p;
  }
}

// ---------------------------------------------------------------- guest -> host

void VsockDevice::process_tx() {
  if (detached_ || !transport_->active()) return;
  Virtqueue& q = transport_->queue(kTxQueue);
  if (!q.ready()) return;
  serve_queue(
      *transport_, mem_, kTxQueue, chain_,
      [this](const DescriptorChain& chain) {
        handle_tx_packet(chain);
        return uint32_t{0};  // tx buffers are device-readable only
      },
      // Every packet may need an answer; stop taking packets while the guest
      // does not take our answers (it cannot grow our memory by flooding).
      [this] {
        if (control_.size() < kMaxControl) return false;
        tx_stalled_ = true;
        return true;
      });
}

void VsockDevice::handle_tx_packet(const DescriptorChain& chain) {
  stats_.tx_packets++;
  Header h{};
  if (chain.readable_bytes() < sizeof h || !chain.read(mem_, 0, &h, sizeof h)) {
    stats_.dropped++;
    stats_.last_drop = vsock::verdict_name(vsock::Verdict::kShort);
    return;
  }
  vsock::Verdict v = vsock::check_tx_packet(h, chain.readable_bytes(), guest_cid_);
  auto it = conns_.find(h.dst_port);
  Conn* c = it != conns_.end() && it->second->logic.peer_port() == h.src_port ? it->second.get() : nullptr;
  if (v != vsock::Verdict::kOk) {
    stats_.dropped++;
    stats_.last_drop = vsock::verdict_name(v);
    // A stream that lost a packet cannot go on.
    bool lost_data = v == vsock::Verdict::kOversized || v == vsock::Verdict::kTruncated ||
                     v == vsock::Verdict::kStrayPayload;
    if (c && lost_data) {
      queue_rst(*c);
      if (c->done) complete(std::move(c->done), -1, code::kVsockRefused, "the guest sent a malformed packet");
    }
    return;
  }
  if (!c) {
    // Unknown connection, or a guest-initiated REQUEST: we listen on nothing,
    // but a REQUEST to a knock port is the guest announcing itself.
    if (h.op == vsock::kOpRequest) note_knock(h.dst_port);
    if (h.op != vsock::kOpRst) queue_control(h.dst_port, h.src_port, vsock::kOpRst);
    return;
  }
  switch (c->logic.on_guest_packet(h)) {
    case Effect::kNone:
      break;  // the peer's credit may have grown: pump() looks
    case Effect::kEstablished:
      established(*c);
      break;
    case Effect::kRefused:
      complete(std::move(c->done), -1, code::kVsockRefused,
               "nothing in the guest accepts connections on vsock port " + std::to_string(c->logic.peer_port()));
      break;
    case Effect::kPeerReset:
      break;  // closed: sweep_closed() releases it
    case Effect::kProtocolError:
      queue_rst(*c);
      if (c->done)
        complete(std::move(c->done), -1, code::kVsockRefused,
                 std::string("the guest answered the connection request with ") + vsock::op_name(h.op));
      break;
    case Effect::kData: {
      uint8_t* dst = c->logic.append_pending(h.len);
      if (!chain.read(mem_, sizeof h, dst, h.len)) {
        queue_rst(*c);
        break;
      }
      flush_to_socket(*c);
      settle(*c);
      break;
    }
    case Effect::kShutdown:
      if (c->logic.state() == State::kClosing)
        queue_rst(*c);  // we closed already; the guest is done too
      else
        settle(*c);
      break;
    case Effect::kCreditRequest:
      if (!c->credit_update_queued) {
        queue_control(c->logic.local_port(), c->logic.peer_port(), vsock::kOpCreditUpdate);
        c->credit_update_queued = true;
      }
      break;
  }
}

void VsockDevice::established(Conn& c) {
  c.deadline = {};
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
    int e = errno;
    queue_rst(c);
    complete(std::move(c.done), -1, code::kIo, std::string("vsock: socketpair: ") + std::strerror(e));
    return;
  }
  std::shared_ptr<Life> life = life_;
  uint32_t port = c.logic.local_port();
  int fd = sv[0];
  bool added = loop_.add(fd, EPOLLIN | EPOLLONESHOT, [life, port, fd](uint32_t events) {
    std::lock_guard<std::mutex> g(life->mu);
    if (life->dev) life->dev->on_socket(port, fd, events);
  });
  if (!added) {
    close(sv[0]);
    close(sv[1]);
    queue_rst(c);
    complete(std::move(c.done), -1, code::kIo, "vsock: the I/O loop refused the socket");
    return;
  }
  c.fd = fd;
  c.armed_events = EPOLLIN;
  stats_.connections++;
  complete(std::move(c.done), sv[1], nullptr, "");
  c.done = nullptr;
}

void VsockDevice::flush_to_socket(Conn& c) {
  while (c.fd >= 0 && c.logic.pending_size() > 0 && !c.socket_write_shut) {
    ssize_t n = send(c.fd, c.logic.pending_data(), c.logic.pending_size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      c.logic.consume_pending(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;  // EPOLLOUT resumes
    host_gone(c, false);
    return;
  }
  State s = c.logic.state();
  if ((s == State::kEstablished || s == State::kClosing) && c.logic.credit_update_due() && !c.credit_update_queued) {
    queue_control(c.logic.local_port(), c.logic.peer_port(), vsock::kOpCreditUpdate);
    c.credit_update_queued = true;
  }
}

void VsockDevice::settle(Conn& c) {
  State s = c.logic.state();
  if (s != State::kEstablished && s != State::kClosing) return;
  if (c.logic.pending_size() != 0) return;  // the host gets everything first
  uint32_t sd = c.logic.guest_shutdown();
  if ((sd & vsock::kShutdownSend) && !c.socket_write_shut && c.fd >= 0) {
    ::shutdown(c.fd, SHUT_WR);  // the host reads EOF after the last byte
    c.socket_write_shut = true;
  }
  if (sd == vsock::kShutdownBoth) queue_rst(c);  // both directions done: the guest waits for our RST
}

void VsockDevice::host_gone(Conn& c, bool eof) {
  if (c.logic.state() != State::kEstablished) {
    if (!eof) queue_rst(c);
    return;
  }
  if (!eof) {
    // Writing failed: nobody reads the host end any more.
    queue_rst(c);
    return;
  }
  c.readable = false;
  c.host_eof = true;
  // Full close (POLLHUP) or only the host's sending side (shutdown(SHUT_WR))?
  pollfd p{c.fd, POLLOUT, 0};
  bool full = poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
  if (full) {
    c.logic.host_closed();
    queue_control(c.logic.local_port(), c.logic.peer_port(), vsock::kOpShutdown, vsock::kShutdownBoth);
    c.deadline = Clock::now() + std::chrono::milliseconds(kCloseTimeoutMs);
  } else {
    queue_control(c.logic.local_port(), c.logic.peer_port(), vsock::kOpShutdown, vsock::kShutdownSend);
  }
}

// ---------------------------------------------------------------- host -> guest

void VsockDevice::queue_control(uint32_t local, uint32_t peer, uint16_t op, uint32_t flags) {
  control_.push_back(Control{local, peer, op, flags});
}

void VsockDevice::queue_rst(Conn& c) {
  queue_control(c.logic.local_port(), c.logic.peer_port(), vsock::kOpRst);
  c.logic.close();
}

bool VsockDevice::writable_ok(const DescriptorChain& chain) {
  if (chain.writable_bytes() >= sizeof(Header)) return true;
  transport_->fail("vsock: rx buffer shorter than a packet header");
  return false;
}

bool VsockDevice::send_control(DescriptorChain& chain, const Control& ctl) {
  Header h = vsock::host_header(guest_cid_, ctl.local_port, ctl.peer_port, ctl.op, ctl.flags);
  auto it = conns_.find(ctl.local_port);
  if (it != conns_.end() && it->second->logic.peer_port() == ctl.peer_port) {
    Conn& c = *it->second;
    c.logic.stamp(h);
    if (ctl.op == vsock::kOpRequest) c.request_sent = true;
    if (ctl.op == vsock::kOpCreditUpdate) c.credit_update_queued = false;
  }
  if (ctl.op == vsock::kOpRst) stats_.rst_sent++;
  return chain.write(mem_, 0, &h, sizeof h);
}

bool VsockDevice::send_data(Conn& c, DescriptorChain& chain, uint32_t* written) {
  *written = 0;
  uint64_t room = chain.writable_bytes() - sizeof(Header);
  uint32_t max = static_cast<uint32_t>(std::min<uint64_t>({c.logic.peer_credit(), vsock::kMaxPayload, room}));
  if (max == 0) return true;
  ssize_t n = recv(c.fd, scratch_.data(), max, MSG_DONTWAIT);
  if (n > 0) {
    Header h = vsock::host_header(guest_cid_, c.logic.local_port(), c.logic.peer_port(), vsock::kOpRw, 0,
                                  static_cast<uint32_t>(n));
    c.logic.stamp(h);
    if (!chain.write(mem_, 0, &h, sizeof h) || !chain.write(mem_, sizeof h, scratch_.data(), static_cast<size_t>(n)))
      return false;
    c.logic.sent_to_guest(static_cast<uint32_t>(n));
    *written = static_cast<uint32_t>(n);
    return true;
  }
  if (n == 0) {
    host_gone(c, true);
  } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
    c.readable = false;  // drained: wait for EPOLLIN again
  } else if (errno != EINTR) {
    host_gone(c, false);
  }
  return true;
}

bool VsockDevice::event_refilled() {
  if (!awaiting_event_refill_) return true;
  Virtqueue& q = transport_->queue(kEventQueue);
  std::optional<uint16_t> idx = q.ready() ? mem_.read_obj<uint16_t>(q.avail_ring() + 2) : std::nullopt;
  if (!idx || *idx != event_avail_mark_) awaiting_event_refill_ = false;
  return !awaiting_event_refill_;
}

void VsockDevice::deliver_reset_event() {
  if (!reset_event_pending_) return;
  Virtqueue& q = transport_->queue(kEventQueue);
  if (!q.ready()) return;
  PopStatus st = q.pop(mem_, chain_);
  if (st == PopStatus::kEmpty) return;  // the event queue's notification brings us back
  if (st == PopStatus::kBroken) {
    transport_->fail(q.error().c_str());
    return;
  }
  vsock::Event ev{vsock::kEventTransportReset};
  if (chain_.writable_bytes() < sizeof ev || !chain_.write(mem_, 0, &ev, sizeof ev)) {
    transport_->fail("vsock: event buffer shorter than an event");
    return;
  }
  if (!q.add_used(mem_, chain_.head(), sizeof ev)) {
    transport_->fail(q.error().c_str());
    return;
  }
  transport_->signal_used(kEventQueue);
  reset_event_pending_ = false;
  stats_.events++;
  // Linux resets its sockets, then re-posts the event buffer; a REQUEST seen
  // before that could be reset along with the old connections.
  awaiting_event_refill_ = true;
  event_avail_mark_ = mem_.read_obj<uint16_t>(q.avail_ring() + 2).value_or(0);
}

bool VsockDevice::pump_rx_once(bool* starved) {
  Virtqueue& q = transport_->queue(kRxQueue);
  if (!q.ready()) {
    *starved = true;
    return false;
  }
  bool wrote = false;
  bool broken = false;
  auto take = [&]() -> bool {
    PopStatus st = q.pop(mem_, chain_);
    if (st == PopStatus::kChain) {
      if (writable_ok(chain_)) return true;
      broken = true;
    } else if (st == PopStatus::kBroken) {
      transport_->fail(q.error().c_str());
      broken = true;
    }
    *starved = true;
    return false;
  };
  auto give = [&](uint32_t len) {
    if (!q.add_used(mem_, chain_.head(), len)) {
      transport_->fail(q.error().c_str());
      broken = true;
      *starved = true;
      return;
    }
    stats_.rx_packets++;
    wrote = true;
  };

  bool hold_requests = !event_refilled();
  for (size_t i = 0; i < control_.size() && !*starved;) {
    if (hold_requests && control_[i].op == vsock::kOpRequest) {
      if (!control_[i].held) {
        control_[i].held = true;
        stats_.held_requests++;
      }
      i++;
      continue;
    }
    if (!take()) break;
    Control ctl = control_[i];
    control_.erase(control_.begin() + static_cast<std::ptrdiff_t>(i));
    if (send_control(chain_, ctl))
      give(sizeof(Header));
    else
      q.undo_pop();
  }
  // One packet per connection per pass: a busy connection does not starve the others.
  size_t control_left = control_.size();
  for (auto& [port, cp] : conns_) {
    if (*starved) break;
    Conn& c = *cp;
    if (c.logic.state() != State::kEstablished || !c.readable || c.host_eof ||
        (c.logic.guest_shutdown() & vsock::kShutdownRcv) || c.logic.peer_credit() == 0)
      continue;
    if (!take()) break;
    uint32_t written = 0;
    if (!send_data(c, chain_, &written)) {
      transport_->fail("vsock: could not write an rx buffer");
      broken = true;
      break;
    }
    if (written)
      give(static_cast<uint32_t>(sizeof(Header)) + written);
    else
      q.undo_pop();
  }
  if (wrote && !broken) transport_->signal_used(kRxQueue);
  // A read that hit EOF queued a SHUTDOWN: another pass delivers it.
  return wrote || (!broken && control_.size() > control_left);
}

void VsockDevice::pump() {
  if (detached_ || quiesced_) return;
  if (transport_->active()) {
    deliver_reset_event();
    bool more = true;
    for (int round = 0; round < 64 && more && transport_->active(); round++) {
      bool starved = false;
      bool progress = pump_rx_once(&starved);
      if (tx_stalled_ && control_.size() < kMaxControl) {
        tx_stalled_ = false;
        process_tx();
        progress = true;
      }
      more = progress && !starved;
    }
    // Still going after 64 packets per connection: let the other devices on
    // this I/O thread run, then continue (nothing else would wake us: the
    // sockets with unread data are not polled).
    if (more) schedule_pump();
  }
  sweep_closed();
  for (auto& [port, c] : conns_) rearm(*c);
  arm_timer();
}

// ---------------------------------------------------------------- bookkeeping

void VsockDevice::rearm(Conn& c) {
  if (c.fd < 0) return;
  State s = c.logic.state();
  uint32_t want = 0;
  if (s == State::kEstablished || s == State::kClosing) {
    if (!c.readable && !c.host_eof && !(c.logic.guest_shutdown() & vsock::kShutdownRcv)) want |= EPOLLIN;
    if (c.logic.pending_size() > 0 && !c.socket_write_shut) want |= EPOLLOUT;
  }
  // Nothing to wait for: leave the registration as it is (a late event finds
  // nothing to do and does not re-arm), so a hung-up socket cannot spin.
  if (want == 0 || want == c.armed_events) return;
  if (loop_.modify(c.fd, want | EPOLLONESHOT)) c.armed_events = want;
}

void VsockDevice::arm_timer() {
  if (timer_fd_ < 0) return;
  Clock::time_point next = Clock::time_point::max();
  for (auto& [port, c] : conns_)
    if (c->deadline != Clock::time_point{}) next = std::min(next, c->deadline);
  if (awaiting_event_refill_) {
    bool held = std::any_of(control_.begin(), control_.end(),
                            [](const Control& c) { return c.op == vsock::kOpRequest; });
    if (held) next = std::min(next, Clock::now() + kRefillPoll);
  }
  if (next == timer_set_) return;  // set already (or expired, and on_timer is on its way)
  timer_set_ = next;
  itimerspec its{};
  if (next != Clock::time_point::max()) {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(next.time_since_epoch()).count();
    if (ns <= 0) ns = 1;
    its.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
    its.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
    if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) its.it_value.tv_nsec = 1;
  }
  timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &its, nullptr);
}

void VsockDevice::on_timer() {
  std::lock_guard<std::mutex> lock(transport_->lock());
  uint64_t expirations;
  ssize_t ignored = read(timer_fd_, &expirations, sizeof expirations);
  (void)ignored;
  timer_set_ = Clock::time_point::max();  // a one-shot timer that fired is disarmed
  if (quiesced_) return;  // deadlines are looked at again by unquiesce()
  Clock::time_point now = Clock::now();
  for (auto& [port, cp] : conns_) {
    Conn& c = *cp;
    if (c.deadline == Clock::time_point{} || c.deadline > now) continue;
    c.deadline = {};
    if (c.logic.state() == State::kConnecting) {
      if (c.request_sent) {
        queue_rst(c);  // so a late RESPONSE finds nothing and the guest forgets it
      } else {
        uint32_t local = c.logic.local_port();
        control_.erase(std::remove_if(control_.begin(), control_.end(),
                                      [local](const Control& x) { return x.local_port == local; }),
                       control_.end());
        c.logic.close();
      }
      complete(std::move(c.done), -1, code::kTimeout,
               "the guest did not answer a connection to vsock port " + std::to_string(c.logic.peer_port()) +
                   " in time (is its vsock driver up and the port listening?)");
    } else if (c.logic.state() == State::kClosing) {
      queue_rst(c);  // the guest never acknowledged our SHUTDOWN
    }
  }
  pump();
}

void VsockDevice::on_socket(uint32_t local_port, int fd, uint32_t events) {
  std::lock_guard<std::mutex> lock(transport_->lock());
  auto it = conns_.find(local_port);
  if (it == conns_.end() || it->second->fd != fd) return;
  Conn& c = *it->second;
  c.armed_events = 0;  // EPOLLONESHOT: this registration fired
  if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) c.readable = true;
  if (quiesced_) return;  // the socket keeps its data; unquiesce() pumps
  if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) {
    flush_to_socket(c);
    settle(c);
  }
  pump();
}

void VsockDevice::drop(uint32_t local_port) {
  auto it = conns_.find(local_port);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  if (c.fd >= 0) release_fd(c.fd);
  if (c.done) complete(std::move(c.done), -1, code::kVsockRefused, "the connection was closed");
  conns_.erase(it);
}

void VsockDevice::sweep_closed() {
  for (auto it = conns_.begin(); it != conns_.end();) {
    auto next = std::next(it);
    if (it->second->logic.state() == State::kClosed) drop(it->first);
    it = next;
  }
}

void VsockDevice::drop_all(const char* code, const std::string& why, bool keep_unsent_requests) {
  for (auto it = conns_.begin(); it != conns_.end();) {
    Conn& c = *it->second;
    if (keep_unsent_requests && c.logic.state() == State::kConnecting && !c.request_sent) {
      ++it;
      continue;
    }
    if (c.fd >= 0) release_fd(c.fd);
    if (c.done) complete(std::move(c.done), -1, code, why);
    it = conns_.erase(it);
  }
  // Only the REQUESTs of the connections kept stay queued.
  control_.erase(std::remove_if(control_.begin(), control_.end(),
                                [this](const Control& x) {
                                  return x.op != vsock::kOpRequest || !conns_.count(x.local_port);
                                }),
                 control_.end());
}

void VsockDevice::release_fd(int fd) {
  // EventLoop::remove() waits for a running callback, which may be waiting
  // for the transport's lock we hold: only the I/O thread removes directly.
  if (loop_.on_loop_thread()) {
    loop_.remove(fd);
    close(fd);
    return;
  }
  EventLoop* loop = &loop_;
  if (!loop_.post([loop, fd] {
        loop->remove(fd);
        close(fd);
      })) {
    loop_.remove(fd);
    close(fd);
  }
}

void VsockDevice::complete(Done done, int fd, const char* code, const std::string& message) {
  if (!done) {
    if (fd >= 0) close(fd);
    return;
  }
  // Runs later on the I/O thread with no lock held, so `done` may call back
  // into the device (connect again) freely.
  auto shared = std::make_shared<Done>(std::move(done));
  std::string msg = message;
  if (!loop_.post([shared, fd, code, msg] { (*shared)(fd, code, msg); })) (*shared)(fd, code, msg);
}

}  // namespace torpor
