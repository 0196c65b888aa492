#include "devices/virtio/net/make_net.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/net/net_device.h"
#include "devices/virtio/net/stream_backend.h"

namespace torpor {

namespace {

struct NetOnTransport {
  VirtioMmioTransport& transport;
  VirtioNetDevice& net;
};

NetOnTransport net_on(VirtioMmioDevice& dev) {
  auto* transport = dynamic_cast<VirtioMmioTransport*>(&dev);
  auto* net = transport ? dynamic_cast<VirtioNetDevice*>(&transport->device()) : nullptr;
  if (!net) throw Error(code::kInternal, "not a virtio-net device");
  return {*transport, *net};
}

}  // namespace

VirtioNetDevice* virtio_net_of(VirtioMmioDevice& dev) {
  auto* transport = dynamic_cast<VirtioMmioTransport*>(&dev);
  return transport ? dynamic_cast<VirtioNetDevice*>(&transport->device()) : nullptr;
}

void virtio_net_attach_stream(VirtioMmioDevice& dev, Fd socket) {
  auto [transport, net] = net_on(dev);
  EventLoop& loop = transport.loop();
  if (loop.on_loop_thread()) throw Error(code::kInternal, "attach_stream on the I/O thread");
  // The old backend goes first: its destructor takes the link down, which
  // must not happen to the new one.
  net.drop_backend();
  auto b = std::make_unique<StreamBackend>(loop, transport.lock(), net, std::move(socket));
  b->start();
  net.own_backend(std::move(b));
}

std::pair<Fd, Fd> make_stream_pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    throw_sys_error(code::kNetBackend, "network backend: socketpair()");
  Fd ours(sv[0]), theirs(sv[1]);
  // Large socket buffers: frames queue in the kernel, not in our process.
  int size = 1 << 20;
  ::setsockopt(ours.get(), SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
  ::setsockopt(ours.get(), SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
  return {std::move(ours), std::move(theirs)};
}

Fd virtio_net_attach_pair(VirtioMmioDevice& dev) {
  auto [ours, theirs] = make_stream_pair();
  virtio_net_attach_stream(dev, std::move(ours));
  return std::move(theirs);
}

void virtio_net_connect_stream(VirtioMmioDevice& dev, const std::string& path) {
  virtio_net_attach_stream(dev, connect_unix_stream(path));
}

void virtio_net_set_egress_policy(VirtioMmioDevice& dev, EgressPolicy policy) {
  auto [transport, net] = net_on(dev);
  std::lock_guard<std::mutex> lock(transport.lock());
  net.set_egress_policy(std::move(policy));
}

std::string virtio_net_backend_error(VirtioMmioDevice& dev) {
  auto [transport, net] = net_on(dev);
  std::lock_guard<std::mutex> lock(transport.lock());
  return net.backend_error();
}

Fd connect_unix_stream(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    throw Error(code::kInvalidArgument, "network backend socket path is empty or longer than 107 bytes");
  std::memcpy(addr.sun_path, path.data(), path.size());
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw_sys_error(code::kNetBackend, "network backend: socket()");
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) throw_sys_error(code::kNetBackend, "network backend: connect(" + path + ")");
  return fd;
}

std::unique_ptr<VirtioMmioDevice> make_virtio_net(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                  const NetOptions& opts) {
  MacAddress mac;
  if (!parse_mac(opts.mac, &mac))
    throw Error(code::kInvalidArgument, "network MAC must look like 52:54:00:12:34:56 (and not be multicast)");
  auto dev = std::make_unique<VirtioMmioTransport>(mem, irq, loop, std::make_unique<VirtioNetDevice>(mem, mac));
  if (!opts.backend_socket.empty()) virtio_net_connect_stream(*dev, opts.backend_socket);
  return dev;
}

}  // namespace torpor
