// virtio-vsock (device type 19): host-initiated stream connections between
// the host (CID 2) and the guest, emulated in the VMM (no vhost).
//
// Queues: 0 rx (device -> guest packets), 1 tx (guest -> device packets),
// 2 event (transport reset). Config space: le64 guest_cid. No device feature
// bits (stream only; SEQPACKET is not offered).
//
// Each connection's host end is one end of an AF_UNIX socketpair; the other
// end is handed to the caller of connect(). The device end is polled by the
// machine's EventLoop (EPOLLONESHOT, re-armed with exactly what the
// connection waits for: EPOLLIN when it may read, EPOLLOUT when guest data
// is waiting for socket space). Data moves:
//   socket -> guest: read only within the guest's credit and into posted rx
//                    buffers; otherwise the socket is not read (its data waits
//                    in the kernel's socket buffer).
//   guest -> socket: buffered per connection up to our buf_alloc (the guest
//                    may not send more: a guest that does is reset); written
//                    as the socket takes it; fwd_cnt reported back.
// See README.md beside this file for what a guest driver must do.
//
// Threads and locks: every VirtioDevice method runs under the transport's
// lock. Socket and timer callbacks and the work of connect() and
// transport_reset() run on the I/O thread and take, in this order, the
// device's life lock (is the device still there?) and the transport's lock.
// Completions (`done`) are posted to the I/O thread and run with no lock
// held. File descriptors are removed from the loop only on the I/O thread
// (a vCPU thread resetting the device hands them over with post()), because
// EventLoop::remove() waits for a running callback, which may be waiting for
// the transport's lock.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/event_loop.h"
#include "base/guest_memory.h"
#include "devices/virtio/queue/queue.h"
#include "devices/virtio/virtio_device.h"
#include "devices/virtio/vsock/connection.h"
#include "devices/virtio/vsock/packet.h"
#include "devices/virtio/vsock/vsock_host.h"

namespace torpor {

class VsockDevice final : public VirtioDevice, public VsockHost {
 public:
  static constexpr uint16_t kQueueSize = 256;
  static constexpr uint32_t kRxQueue = 0, kTxQueue = 1, kEventQueue = 2;
  // How long after the host closed a connection we wait for the guest's RST.
  static constexpr int kCloseTimeoutMs = 2000;
  // After a transport reset, REQUESTs are held until the guest re-posts an
  // event buffer: Linux resets its sockets *silently* (no RST to the host)
  // and only then re-posts, so a connection it accepted before that would be
  // dead on the guest's side and alive on ours, a host waiting forever for an
  // answer. There is no time limit of the device's own (a limit would bring
  // that back whenever the guest is slower than it, as in an emulated nested
  // host under load): each connect's own timeout ends the wait.
  // Control packets (RST, CREDIT_UPDATE...) queued for the guest at most;
  // beyond it the tx queue is left alone until the guest takes some.
  static constexpr size_t kMaxControl = 1024;

  VsockDevice(GuestMemory& mem, EventLoop& loop, uint64_t guest_cid);
  ~VsockDevice() override;

  // VirtioDevice
  const char* name() const override { return "vsock"; }
  uint32_t device_type() const override { return virtio::kDeviceVsock; }
  uint64_t device_features() const override { return virtio::kFRingFeatures; }
  uint32_t num_queues() const override { return 3; }
  uint16_t queue_max_size(uint32_t) const override { return kQueueSize; }
  void read_config(uint64_t offset, uint8_t* data, size_t len) override;
  void write_config(uint64_t, const uint8_t*, size_t) override {}
  void attach(VirtioTransport& transport) override { transport_ = &transport; }
  void activate() override;
  void queue_notify(uint32_t index) override;
  void reset() override;
  // Connections are not saved: they are host sockets. On restore every
  // connection is gone; the machine calls transport_reset() so the guest
  // drops its side too, and the host reconnects.
  void save(StateWriter& out) const override;
  void restore(StateReader& in) override;
  // While quiesced: sockets are disarmed, the timer stopped, and nothing is
  // read from a socket or written to the guest; host data waits in the
  // sockets' kernel buffers and arrives, in order, after unquiesce().
  void quiesce() override;
  void unquiesce() override;
  // Stops every callback and closes every descriptor (the transport's
  // destructor calls it, with the vCPUs stopped). Pending connects complete
  // with VSOCK_REFUSED. Idempotent.
  void detach() override;

  // VsockHost (any thread). done(fd, nullptr, "") on success.
  void connect(uint32_t port, uint32_t timeout_ms,
               std::function<void(int fd, const char* code, const std::string& message)> done) override;
  void transport_reset() override;
  void set_knock_ports(const std::vector<uint32_t>& ports, std::function<void()> knocked) override;
  std::vector<std::pair<uint32_t, uint64_t>> knocks() const override;  // takes the transport's lock

  uint64_t guest_cid() const { return guest_cid_; }
  VsockStats stats() const override;  // takes the transport's lock

 private:
  using Done = std::function<void(int, const char*, const std::string&)>;
  using Clock = std::chrono::steady_clock;

  struct Conn {
    explicit Conn(uint32_t local, uint32_t peer) : logic(local, peer) {}
    vsock::Connection logic;
    int fd = -1;                  // device end of the socketpair
    uint32_t armed_events = 0;    // what the oneshot registration waits for; 0: not armed
    bool readable = false;        // the socket may have data (EPOLLIN/HUP seen, not drained)
    bool host_eof = false;        // the host end will send no more
    bool socket_write_shut = false;
    bool request_sent = false;
    bool credit_update_queued = false;
    Clock::time_point deadline{};  // connect timeout or close timeout; {} if none
    Done done;                     // until established or refused
  };
  struct Control {
    uint32_t local_port;
    uint32_t peer_port;
    uint16_t op;
    uint32_t flags;
    bool held = false;  // a REQUEST counted in stats_.held_requests once
  };
  // Lets callbacks and posted closures find out whether the device still exists.
  struct Life {
    std::mutex mu;
    VsockDevice* dev;
  };

  // --- all below run with the transport's lock held
  void process_tx();
  void handle_tx_packet(const DescriptorChain& chain);
  void pump();  // everything that may have become possible, then re-arm fds and timer
  void schedule_pump();  // pump() again soon from the I/O thread
  bool pump_rx_once(bool* starved);
  bool send_control(DescriptorChain& chain, const Control& c);
  bool send_data(Conn& c, DescriptorChain& chain, uint32_t* written);  // false: guest memory refused
  void deliver_reset_event();
  bool event_refilled();
  void flush_to_socket(Conn& c);
  void settle(Conn& c);
  void host_gone(Conn& c, bool peer_reading);
  void established(Conn& c);
  void queue_control(uint32_t local, uint32_t peer, uint16_t op, uint32_t flags = 0);
  void queue_rst(Conn& c);
  void note_knock(uint32_t port);
  void drop(uint32_t local_port);
  void drop_all(const char* code, const std::string& why, bool keep_unsent_requests);
  void sweep_closed();
  void complete(Done done, int fd, const char* code, const std::string& message);
  void release_fd(int fd);
  void rearm(Conn& c);
  void arm_timer();
  uint32_t allocate_port();
  bool writable_ok(const DescriptorChain& chain);

  // --- I/O thread entry points (take the locks themselves)
  void on_socket(uint32_t local_port, int fd, uint32_t events);
  void on_timer();
  void start_connect(uint32_t port, uint32_t timeout_ms, Done done);
  void do_transport_reset();

  GuestMemory& mem_;
  EventLoop& loop_;
  VirtioTransport* transport_ = nullptr;
  std::shared_ptr<Life> life_;
  int timer_fd_ = -1;
  // What timer_fd_ is set to (max(): disarmed), so that arm_timer, called after every pump
  // (every guest kick), makes no system call when the earliest deadline did not move.
  Clock::time_point timer_set_ = Clock::time_point::max();

  uint64_t guest_cid_;
  uint32_t next_port_ = 1024;
  std::map<uint32_t, std::unique_ptr<Conn>> conns_;  // by local (host) port
  std::deque<Control> control_;
  bool tx_stalled_ = false;
  bool detached_ = false;
  bool pump_scheduled_ = false;
  bool quiesced_ = false;
  bool reset_event_pending_ = false;
  bool awaiting_event_refill_ = false;
  uint16_t event_avail_mark_ = 0;
  std::map<uint32_t, uint64_t> knocks_;  // knock port -> knocks counted (fixed set of keys)
  std::function<void()> knocked_;
  bool knock_report_posted_ = false;  // a report waits on the I/O thread
  std::vector<uint8_t> scratch_;  // one packet's payload
  DescriptorChain chain_;
  VsockStats stats_;
};

}  // namespace torpor
