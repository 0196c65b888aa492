#include "devices/virtio/net/net_mmio.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>

#include "common/error.h"
#include "devices/virtio/virtio_mmio.h"

namespace torpor {

NetMmioDevice::NetMmioDevice(GuestMemory& mem, IrqLine& irq, EventLoop& loop, const MacAddress& mac) : loop_(loop) {
  auto dev = std::make_unique<VirtioNetDevice>(mem, mac);
  net_ = dev.get();
  transport_ = std::make_unique<VirtioMmioTransport>(mem, irq, loop, std::move(dev));
}

NetMmioDevice::~NetMmioDevice() { detach_backend(); }

void NetMmioDevice::detach_backend() {
  // The destructor detaches it from the device and waits for its callback.
  backend_.reset();
}

void NetMmioDevice::attach_stream(Fd socket) {
  if (loop_.on_loop_thread()) throw Error(code::kInternal, "attach_stream on the I/O thread");
  detach_backend();
  auto b = std::make_unique<StreamBackend>(loop_, transport_->lock(), *net_, std::move(socket));
  b->start();
  backend_ = std::move(b);
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

Fd NetMmioDevice::attach_pair() {
  auto [ours, theirs] = make_stream_pair();
  attach_stream(std::move(ours));
  return std::move(theirs);
}

void NetMmioDevice::connect_stream(const std::string& path) { attach_stream(connect_unix_stream(path)); }

void NetMmioDevice::set_egress_policy(EgressPolicy policy) {
  std::lock_guard<std::mutex> lock(transport_->lock());
  net_->set_egress_policy(std::move(policy));
}

std::string NetMmioDevice::backend_error() {
  std::lock_guard<std::mutex> lock(transport_->lock());
  return backend_ ? backend_->error() : std::string();
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
  auto dev = std::make_unique<NetMmioDevice>(mem, irq, loop, mac);
  if (!opts.backend_socket.empty()) dev->connect_stream(opts.backend_socket);
  return dev;
}

NetMmioDevice* virtio_net_of(VirtioMmioDevice& dev) { return dynamic_cast<NetMmioDevice*>(&dev); }

}  // namespace torpor
