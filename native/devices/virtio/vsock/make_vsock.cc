// make_virtio_vsock (declared in devices/virtio/virtio_mmio.h).
#include "devices/virtio/virtio_mmio.h"
#include "devices/virtio/vsock/vsock_mmio.h"

namespace torpor {

std::unique_ptr<VirtioMmioDevice> make_virtio_vsock(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                    const VsockOptions& opts, VsockHost** host) {
  auto dev = std::make_unique<VsockMmioDevice>(mem, irq, loop, opts.guest_cid);
  if (host) *host = &dev->vsock();
  return dev;
}

}  // namespace torpor
