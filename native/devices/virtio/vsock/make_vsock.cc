#include "devices/virtio/vsock/make_vsock.h"

#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/vsock/vsock_device.h"

namespace torpor {

std::unique_ptr<VirtioMmioDevice> make_virtio_vsock(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                    const VsockOptions& opts, VsockHost** host) {
  auto dev = std::make_unique<VsockDevice>(mem, loop, opts.guest_cid);
  if (host) *host = dev.get();
  // The transport detaches the device (its sockets and timer) before it goes.
  return std::make_unique<VirtioMmioTransport>(mem, irq, loop, std::move(dev));
}

}  // namespace torpor
