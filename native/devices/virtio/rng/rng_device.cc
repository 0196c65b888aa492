#include "devices/virtio/rng/rng_device.h"
#include "devices/virtio/serve_queue.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace torpor {

void VirtioRngDevice::read_config(uint64_t, uint8_t* data, size_t len) { std::memset(data, 0, len); }

void VirtioRngDevice::queue_notify(uint32_t index) {
  if (index != 0 || !transport_) return;
  serve_queue(*transport_, mem_, 0, chain_, [this](const DescriptorChain& chain) { return fill(chain); });
}

uint32_t VirtioRngDevice::fill(const DescriptorChain& chain) {
  uint32_t total = 0;
  for (const auto& b : chain.writable()) {
    uint32_t want = std::min<uint32_t>(b.len, kMaxPerRequest - total);
    if (want == 0) break;
    uint8_t* p = mem_.host_ptr(b.gpa, want);
    if (!p) break;
    uint32_t got = 0;
    while (got < want) {
      ssize_t n = getrandom(p + got, want - got, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        break;
      }
      got += static_cast<uint32_t>(n);
    }
    if (got) mem_.mark_dirty(b.gpa, got);
    total += got;
    if (got < want) break;
  }
  return total;
}

}  // namespace torpor
