// The loop every virtio device runs when the driver kicks a queue: take each
// available chain in order, let the device handle it, return it on the used
// ring, and signal the driver once for the whole batch.
#pragma once

#include <cstdint>

#include "devices/virtio/queue/queue.h"
#include "devices/virtio/virtio_device.h"
#include "base/guest_memory.h"

namespace torpor {

// `handle(chain)` returns how many bytes it wrote into the chain's writable
// buffers. `stop()` is asked before each chain is taken: true leaves the rest
// available for later (back-pressure). A malformed chain, or a used ring that
// cannot be written, fails the device (DEVICE_NEEDS_RESET) and ends the batch.
// Call with the transport's lock held.
template <typename Handle, typename Stop>
void serve_queue(VirtioTransport& transport, GuestMemory& mem, uint32_t index, DescriptorChain& chain,
                 Handle&& handle, Stop&& stop) {
  Virtqueue& q = transport.queue(index);
  bool any = false;
  while (!stop()) {
    PopStatus st = q.pop(mem, chain);
    if (st == PopStatus::kEmpty) break;
    if (st == PopStatus::kBroken) {
      transport.fail(q.error().c_str());
      return;
    }
    uint32_t written = handle(chain);
    if (!q.add_used(mem, chain.head(), written)) {
      transport.fail(q.error().c_str());
      return;
    }
    any = true;
  }
  // One interrupt per batch, and only if the driver asked for it.
  if (any) transport.signal_used(index);
}

template <typename Handle>
void serve_queue(VirtioTransport& transport, GuestMemory& mem, uint32_t index, DescriptorChain& chain,
                 Handle&& handle) {
  serve_queue(transport, mem, index, chain, static_cast<Handle&&>(handle), [] { return false; });
}

}  // namespace torpor
