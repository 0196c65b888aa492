#include "devices/virtio/rng/make_rng.h"

#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/rng/rng_device.h"

namespace torpor {

std::unique_ptr<VirtioMmioDevice> make_virtio_rng(GuestMemory& mem, IrqLine& irq, EventLoop& loop) {
  return std::make_unique<VirtioMmioTransport>(mem, irq, loop, std::make_unique<VirtioRngDevice>(mem));
}

}  // namespace torpor
