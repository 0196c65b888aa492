// virtio-vsock on the virtio-mmio transport.
#pragma once

#include <memory>

#include "base/event_loop.h"
#include "base/guest_memory.h"
#include "devices/virtio/virtio_mmio.h"
#include "devices/virtio/vsock/vsock_host.h"

namespace torpor {

// `*host` (when given): the device's host side, living as long as the device.
std::unique_ptr<VirtioMmioDevice> make_virtio_vsock(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                    const VsockOptions& opts, VsockHost** host);

}  // namespace torpor
