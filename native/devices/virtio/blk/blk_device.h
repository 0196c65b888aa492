// virtio-blk (virtio 1.2 §5.2): request parsing and status codes over a Disk.
//
// One request queue. Requests run synchronously on the I/O thread under the
// transport's lock, so when save() can take the lock no request is in flight.
// Data moves straight between the disk and the guest's buffers (host
// pointers from GuestMemory, pages marked dirty), without a bounce buffer.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "devices/virtio/blk/disk.h"
#include "devices/virtio/queue/queue.h"
#include "devices/virtio/virtio_device.h"
#include "base/guest_memory.h"

namespace torpor {

namespace virtio_blk {
inline constexpr uint64_t kFSegMax = uint64_t{1} << 2;
inline constexpr uint64_t kFRo = uint64_t{1} << 5;
inline constexpr uint64_t kFBlkSize = uint64_t{1} << 6;
inline constexpr uint64_t kFFlush = uint64_t{1} << 9;
inline constexpr uint64_t kFTopology = uint64_t{1} << 10;
inline constexpr uint64_t kFDiscard = uint64_t{1} << 13;

inline constexpr uint32_t kTIn = 0;
inline constexpr uint32_t kTOut = 1;
inline constexpr uint32_t kTFlush = 4;
inline constexpr uint32_t kTGetId = 8;
inline constexpr uint32_t kTDiscard = 11;

inline constexpr uint8_t kSOk = 0;
inline constexpr uint8_t kSIoErr = 1;
inline constexpr uint8_t kSUnsupp = 2;

inline constexpr uint32_t kSectorSize = 512;
inline constexpr uint16_t kQueueSize = 256;
inline constexpr uint32_t kSegMax = kQueueSize - 2;  // header and status take a descriptor each
inline constexpr size_t kIdBytes = 20;
// DISCARD limits offered in the config space.
inline constexpr uint32_t kMaxDiscardSectors = 1u << 22;  // 2 GiB per segment
inline constexpr uint32_t kMaxDiscardSegments = 32;
inline constexpr uint32_t kDiscardAlignment = 8;  // sectors: the overlay's 4 KiB block

struct DiscardSegment {
  uint64_t sector;
  uint32_t num_sectors;
  uint32_t flags;  // bit 0 (unmap) is only meaningful for WRITE_ZEROES
};
static_assert(sizeof(DiscardSegment) == 16);

struct RequestHeader {
  uint32_t type;
  uint32_t reserved;
  uint64_t sector;
};
static_assert(sizeof(RequestHeader) == 16);
}  // namespace virtio_blk

class VirtioBlkDevice final : public VirtioDevice {
 public:
  // serial: the GET_ID answer, at most 20 bytes (longer is cut). DISCARD is
  // offered when the disk takes it (probed with an empty discard).
  VirtioBlkDevice(GuestMemory& mem, std::unique_ptr<Disk> disk, std::string serial, bool read_only);

  const char* name() const override { return "blk"; }
  uint32_t device_type() const override { return virtio::kDeviceBlock; }
  uint64_t device_features() const override;
  uint32_t num_queues() const override { return 1; }
  uint16_t queue_max_size(uint32_t) const override { return virtio_blk::kQueueSize; }
  void read_config(uint64_t offset, uint8_t* data, size_t len) override;
  void write_config(uint64_t, const uint8_t*, size_t) override {}  // nothing writable
  void attach(VirtioTransport& transport) override { transport_ = &transport; }
  void activate() override {}
  void queue_notify(uint32_t index) override;
  void reset() override {}
  void save(StateWriter& out) const override;
  // Accepts a state saved for a disk of the same size or a smaller one (the
  // disk grew since: restored_config_changed() then says so, and the guest's
  // driver re-reads the capacity); a larger one is refused (SNAPSHOT_INVALID):
  // the guest's filesystem may reach past this disk's end.
  void restore(StateReader& in) override;
  bool restored_config_changed() const override { return grown_since_save_; }

  Disk& disk() { return *disk_; }
  // Snapshot support (under the transport's lock, device quiesced): the
  // machine stacks a new top layer over the disk as it was.
  std::unique_ptr<Disk> take_disk() { return std::move(disk_); }
  void set_disk(std::unique_ptr<Disk> disk) { disk_ = std::move(disk); }
  uint64_t capacity_sectors() const { return disk_->size() / virtio_blk::kSectorSize; }

 private:
  // Serves one request; returns the byte count for the used ring.
  uint32_t handle(const DescriptorChain& chain);
  uint8_t do_in(const DescriptorChain& chain, uint64_t offset, uint64_t len);
  uint8_t do_out(const DescriptorChain& chain, uint64_t offset, uint64_t len);
  uint8_t do_discard(const DescriptorChain& chain, uint64_t len);
  bool range_ok(uint64_t sector, uint64_t len) const;

  GuestMemory& mem_;
  std::unique_ptr<Disk> disk_;
  std::string serial_;
  bool read_only_;
  bool discard_;  // the disk takes discard hints
  bool grown_since_save_ = false;  // the last restore() found the disk larger than saved
  VirtioTransport* transport_ = nullptr;
  std::array<uint8_t, 60> config_{};
  DescriptorChain chain_;
};

class VirtioMmioDevice;

// For the snapshot code. The blk device behind a transport made by
// make_virtio_blk, or nullptr for any other device. Call its methods only
// under the transport's lock (virtio_blk_flush does that).
VirtioBlkDevice* virtio_blk_of(VirtioMmioDevice& dev);
// Takes the transport's lock (so no request is in flight: requests complete
// under it) and flushes the disk: data synced, map persisted. 0 or -errno;
// -EINVAL when `dev` is not a virtio-blk device. Blocks on fdatasync: call
// it off the JS thread.
int virtio_blk_flush(VirtioMmioDevice& dev);
// Flushes the disk, then stacks a new empty overlay at `path` over it (the
// old top becomes a read-only lower layer: a snapshot froze it). Same lock
// and thread rules as virtio_blk_flush. 0 or -errno.
int virtio_blk_push_overlay(VirtioMmioDevice& dev, const std::string& path);
// Replaces every layer below the disk's top overlay with `lower` (the same
// bytes in fewer layers: the frozen layers after a merge), closing the old
// ones. Same lock and thread rules. 0, -EINVAL when the top is not an overlay
// or `lower` has another size than the lower disk it replaces.
int virtio_blk_replace_lower(VirtioMmioDevice& dev, std::unique_ptr<Disk> lower);

}  // namespace torpor
