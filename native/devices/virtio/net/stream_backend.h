// The virtio-net device's backend over a connected stream socket speaking
// QEMU's stream protocol (stream_frame.h): passt's end of the network.
//
// Bounded both ways: at most kOutLimit bytes (plus one frame) wait for the
// socket, after which the device stops taking tx chains (can_send() false)
// until the socket drains; received bytes are read only while the device
// takes frames, at most one read buffer (kReadBuffer) at a time.
//
// Each frame goes to the socket in its own send (flush_out): the peer's reads
// then always end on a frame boundary, which passt's reader needs.
//
// A peer that hangs up, errs, or sends a length the protocol forbids is
// dead: the backend detaches itself from the device (the guest sees the link
// go down) and records why (error()); the machine's owner learns of the
// backend's death from the process it started, and may attach a new one.
//
// Threads: the socket callback runs on the I/O thread and takes the
// transport's lock; the NetBackend methods run with that lock already held
// (any thread). Reading from the socket and removing it from the loop happen
// only on the I/O thread; other threads only change what the registration
// waits for (EventLoop::modify never blocks). Destroy without the transport's
// lock held (the destructor waits for a running callback).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "base/event_loop.h"
#include "base/fd.h"
#include "devices/virtio/net/net_device.h"

namespace torpor {

struct StreamBackendStats {
  uint64_t frames_in = 0, frames_out = 0;
  uint64_t bytes_in = 0, bytes_out = 0;
};

class StreamBackend final : public NetBackend {
 public:
  static constexpr size_t kOutLimit = 256 * 1024;
  static constexpr size_t kReadChunk = 64 * 1024;
  static constexpr size_t kReadBuffer = 4 + virtio_net::kMaxFrameLen + kReadChunk;

  // `fd`: a connected stream socket (made non-blocking here). `lock`: the
  // device's transport lock.
  StreamBackend(EventLoop& loop, std::mutex& lock, VirtioNetDevice& device, Fd fd);
  ~StreamBackend() override;
  StreamBackend(const StreamBackend&) = delete;
  StreamBackend& operator=(const StreamBackend&) = delete;

  // Registers the socket with the loop and attaches to the device. Throws
  // Error(NET_BACKEND) when the loop refuses the socket. Call without the lock.
  void start();

  // NetBackend (lock held)
  bool can_send() const override;
  void send(const uint8_t* frame, size_t len) override;
  void rx_ready() override;

  // Lock held.
  bool dead() const { return dead_; }
  std::string error() const override { return error_; }
  const StreamBackendStats& stats() const { return stats_; }

 private:
  void on_events(uint32_t events);  // I/O thread; takes the lock
  bool read_some();                 // false: the peer is gone
  bool deliver();                   // false: the device refused a frame
  bool flush_out();                 // false: the socket failed
  void rearm();
  void die(const std::string& why);

  EventLoop& loop_;
  std::mutex& lock_;
  VirtioNetDevice& device_;
  Fd fd_;
  bool registered_ = false;
  bool attached_ = false;
  bool dead_ = false;
  bool rx_paused_ = false;
  uint32_t armed_ = 0;
  std::string error_;
  std::vector<uint8_t> in_;
  size_t in_off_ = 0, in_len_ = 0;  // unparsed bytes: in_[in_off_, in_len_)
  std::vector<uint8_t> out_;
  size_t out_off_ = 0;              // unsent bytes: out_[out_off_, end)
  size_t out_frame_left_ = 0;       // >0: out_off_ is inside a frame, this many bytes of it unsent
  StreamBackendStats stats_;
};

}  // namespace torpor
