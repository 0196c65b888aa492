// make_virtio_blk (blk/make_blk.h), and the calls that reach the disk behind
// its transport (virtio_blk_*, blk_device.h).
#include "devices/virtio/blk/make_blk.h"

#include <cerrno>
#include <memory>
#include <mutex>

#include "common/error.h"
#include "devices/virtio/blk/blk_device.h"
#include "devices/virtio/blk/overlay_disk.h"
#include "devices/virtio/blk/raw_image.h"
#include "devices/virtio/mmio/transport.h"

namespace torpor {

std::unique_ptr<VirtioMmioDevice> make_virtio_blk(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                  const BlkOptions& opts) {
  precondition(opts.serial.size() <= virtio_blk::kIdBytes, "disk serial of at most 20 bytes");
  if (opts.base_path.empty() && opts.overlay_path.empty())
    throw Error(code::kInvalidArgument, "a disk needs a base image, an overlay, or both");
  if (opts.overlay_path.empty() && !opts.read_only)
    throw Error(code::kInvalidArgument,
                "a writable disk needs an overlay path: the base image is never written");
  if (opts.size_bytes % 512)
    throw Error(code::kInvalidArgument, "disk size must be a multiple of 512 bytes");
  std::unique_ptr<Disk> base;
  if (!opts.base_path.empty()) base = std::make_unique<RawImage>(opts.base_path);
  uint64_t size = opts.size_bytes ? opts.size_bytes : (base ? base->size() : 0);
  if (size == 0) throw Error(code::kInvalidArgument, "disk size is 0 (give size_bytes for an overlay-only disk)");
  // Larger than the base: the overlay takes the size, the base reads zeros past its end.
  if (base && size < base->size())
    throw Error(code::kInvalidArgument, "disk size " + std::to_string(size) + " is smaller than the base image (" +
                                            std::to_string(base->size()) + " bytes): a disk never shrinks");
  if (opts.overlay_path.empty() && base && size != base->size())
    base = std::make_unique<RawImage>(opts.base_path, size);  // read-only, the base alone: it shows the size
  std::unique_ptr<Disk> disk;
  if (opts.overlay_path.empty())
    disk = std::move(base);
  else
    disk = std::make_unique<OverlayDisk>(std::move(base), opts.overlay_path, size, opts.read_only);
  return make_virtio_blk_on(mem, irq, loop, std::move(disk), opts);
}

std::unique_ptr<VirtioMmioDevice> make_virtio_blk_on(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                                     std::unique_ptr<Disk> disk, const BlkOptions& opts) {
  if (!disk) throw Error(code::kInvalidArgument, "virtio-blk: no disk");
  auto dev = std::make_unique<VirtioBlkDevice>(mem, std::move(disk), opts.serial, opts.read_only);
  return std::make_unique<VirtioMmioTransport>(mem, irq, loop, std::move(dev));
}

int virtio_blk_push_overlay(VirtioMmioDevice& dev, const std::string& path) {
  VirtioBlkDevice* blk = virtio_blk_of(dev);
  if (!blk) return -EINVAL;
  auto& transport = static_cast<VirtioMmioTransport&>(dev);
  std::lock_guard<std::mutex> lock(transport.lock());
  if (int rc = blk->disk().flush(); rc < 0) return rc;
  uint64_t size = blk->disk().size();
  // Create and check the new layer's files first: the constructor below
  // takes the current disk, which a failure there would lose.
  try {
    OverlayDisk probe(nullptr, path, size);
  } catch (const Error& e) {
    return -(e.sys_errno() ? e.sys_errno() : EIO);
  }
  auto* old_top = dynamic_cast<OverlayDisk*>(&blk->disk());
  try {
    blk->set_disk(std::make_unique<OverlayDisk>(blk->take_disk(), path, size));
  } catch (const Error& e) {
    return -(e.sys_errno() ? e.sys_errno() : EIO);
  }
  if (old_top) old_top->freeze();  // the new top's lower now: never written again
  return 0;
}

int virtio_blk_replace_lower(VirtioMmioDevice& dev, std::unique_ptr<Disk> lower) {
  VirtioBlkDevice* blk = virtio_blk_of(dev);
  if (!blk || !lower) return -EINVAL;
  auto& transport = static_cast<VirtioMmioTransport&>(dev);
  std::lock_guard<std::mutex> lock(transport.lock());
  auto* top = dynamic_cast<OverlayDisk*>(&blk->disk());
  // The same bytes means the same size as the lower disk it replaces (which
  // may be smaller than the top: a disk grown beyond its template).
  if (!top || lower->size() != top->lower_size()) return -EINVAL;
  std::unique_ptr<Disk> old = top->replace_lower(std::move(lower));
  return 0;  // `old` closes its layers here, under the lock: no request reads them
}

VirtioBlkDevice* virtio_blk_of(VirtioMmioDevice& dev) {
  auto* transport = dynamic_cast<VirtioMmioTransport*>(&dev);
  return transport ? dynamic_cast<VirtioBlkDevice*>(&transport->device()) : nullptr;
}

int virtio_blk_flush(VirtioMmioDevice& dev) {
  VirtioBlkDevice* blk = virtio_blk_of(dev);
  if (!blk) return -EINVAL;
  auto& transport = static_cast<VirtioMmioTransport&>(dev);
  std::lock_guard<std::mutex> lock(transport.lock());
  return blk->disk().flush();
}

}  // namespace torpor
