// The virtio-net device as the machine sees it: the virtio-mmio transport
// around a VirtioNetDevice, plus the backend behind it, which can be
// replaced while the machine exists (a restored machine gets a fresh
// backend: the old process and every flow it carried are gone).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "base/fd.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/net/net_device.h"
#include "devices/virtio/net/stream_backend.h"

namespace torpor {

class NetMmioDevice final : public VirtioMmioDevice {
 public:
  NetMmioDevice(GuestMemory& mem, IrqLine& irq, EventLoop& loop, const MacAddress& mac);
  ~NetMmioDevice() override;

  const char* name() const override { return transport_->name(); }
  void read(uint64_t offset, uint8_t* data, size_t len) override { transport_->read(offset, data, len); }
  void write(uint64_t offset, const uint8_t* data, size_t len) override { transport_->write(offset, data, len); }
  void save(StateWriter& out) const override { transport_->save(out); }
  void restore(StateReader& in) override { transport_->restore(in); }
  uint32_t num_queues() const override { return transport_->num_queues(); }
  void notify(uint32_t queue) override { transport_->notify(queue); }
  void quiesce() override { transport_->quiesce(); }
  void unquiesce() override { transport_->unquiesce(); }

  // Replaces the backend with one over `socket` (a connected stream socket).
  // Any thread but the I/O thread, without the transport's lock.
  void attach_stream(Fd socket);
  // Connects to a Unix stream socket (passt's --socket path) and attaches it.
  // Throws Error(NET_BACKEND) when nothing listens there.
  void connect_stream(const std::string& path);
  // Makes a socketpair, attaches one end and returns the other (the caller
  // owns it): hand it to a backend process (passt --fd). Throws NET_BACKEND.
  Fd attach_pair();
  // What the guest may send from now on (lib/net sets it with each backend).
  void set_egress_policy(EgressPolicy policy);
  // Removes the backend (the guest sees the link go down).
  void detach_backend();

  VirtioNetDevice& net() { return *net_; }
  VirtioMmioTransport& transport() { return *transport_; }
  // Why the backend died ("" while it lives or when there is none).
  std::string backend_error();

 private:
  VirtioNetDevice* net_;
  std::unique_ptr<VirtioMmioTransport> transport_;
  EventLoop& loop_;
  std::unique_ptr<StreamBackend> backend_;
};

// The NetMmioDevice behind a machine's device slot, or nullptr.
NetMmioDevice* virtio_net_of(VirtioMmioDevice& dev);

// A connected pair of Unix stream sockets (CLOEXEC) with large buffers: one
// end for the device (attach_stream), one for the backend process. Throws
// NET_BACKEND.
std::pair<Fd, Fd> make_stream_pair();

// A connected, non-blocking Unix stream socket to `path`.
Fd connect_unix_stream(const std::string& path);

}  // namespace torpor
