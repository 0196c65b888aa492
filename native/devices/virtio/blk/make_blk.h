// virtio-blk on the virtio-mmio transport: the disk opened from its options
// (or handed over already open), the device, the transport around it.
#pragma once

#include <memory>

#include "base/event_loop.h"
#include "base/guest_memory.h"
#include "devices/virtio/blk/blk_options.h"
#include "devices/virtio/virtio_mmio.h"

namespace torpor {

class Disk;

// Throws INVALID_ARGUMENT on options that make no disk (see make_blk.cc).
std::unique_ptr<VirtioMmioDevice> make_virtio_blk(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                  const BlkOptions& opts);
// The same over a disk already opened (a snapshot's chain of layers).
std::unique_ptr<VirtioMmioDevice> make_virtio_blk_on(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                     std::unique_ptr<Disk> disk, const BlkOptions& opts);

}  // namespace torpor
