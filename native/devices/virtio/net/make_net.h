// virtio-net on the virtio-mmio transport, and the backend behind it, which
// its owner replaces while the machine exists (a restored machine gets a
// fresh backend: the old process and every flow it carried are gone).
//
// The device owns its backend (VirtioNetDevice::own_backend): the
// transport's destructor detaches the device, which lets the backend go
// before the queues and the lock it uses.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "base/event_loop.h"
#include "base/fd.h"
#include "base/guest_memory.h"
#include "devices/virtio/net/egress_policy.h"
#include "devices/virtio/net/net_options.h"
#include "devices/virtio/virtio_mmio.h"

namespace torpor {

class VirtioNetDevice;

// Throws INVALID_ARGUMENT on a bad MAC, NET_BACKEND when the backend socket
// cannot be connected.
std::unique_ptr<VirtioMmioDevice> make_virtio_net(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                  const NetOptions& opts);

// The net device behind a transport made by make_virtio_net, or nullptr.
// Call its methods only under the transport's lock.
VirtioNetDevice* virtio_net_of(VirtioMmioDevice& dev);

// The calls below take a device made by make_virtio_net (else
// Error(INTERNAL)), run on any thread but the I/O thread, and take the
// transport's lock themselves.
//
// Replaces the backend with one over `socket` (a connected stream socket).
void virtio_net_attach_stream(VirtioMmioDevice& dev, Fd socket);
// Connects to a Unix stream socket (passt's --socket path) and attaches it.
// Throws Error(NET_BACKEND) when nothing listens there.
void virtio_net_connect_stream(VirtioMmioDevice& dev, const std::string& path);
// Makes a socketpair, attaches one end and returns the other (the caller
// owns it): hand it to a backend process (passt --fd). Throws NET_BACKEND.
Fd virtio_net_attach_pair(VirtioMmioDevice& dev);
// What the guest may send from now on (lib/net sets it with each backend).
void virtio_net_set_egress_policy(VirtioMmioDevice& dev, EgressPolicy policy);
// Why the backend died ("" while it lives or when there is none).
std::string virtio_net_backend_error(VirtioMmioDevice& dev);

// A connected pair of Unix stream sockets (CLOEXEC) with large buffers: one
// end for the device (virtio_net_attach_stream), one for the backend
// process. Throws NET_BACKEND.
std::pair<Fd, Fd> make_stream_pair();

// A connected, non-blocking Unix stream socket to `path`.
Fd connect_unix_stream(const std::string& path);

}  // namespace torpor
