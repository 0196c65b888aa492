// virtio-rng on the virtio-mmio transport.
#pragma once

#include <memory>

#include "base/event_loop.h"
#include "base/guest_memory.h"
#include "devices/virtio/virtio_mmio.h"

namespace torpor {

std::unique_ptr<VirtioMmioDevice> make_virtio_rng(GuestMemory& mem, IrqLine& irq, EventLoop& loop);

}  // namespace torpor
