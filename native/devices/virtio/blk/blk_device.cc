#include "devices/virtio/blk/blk_device.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "devices/virtio/serve_queue.h"

namespace torpor {

using namespace virtio_blk;

namespace {
template <typename T>
void put(std::array<uint8_t, 60>& cfg, size_t off, T v) {
  std::memcpy(cfg.data() + off, &v, sizeof v);
}
}  // namespace

VirtioBlkDevice::VirtioBlkDevice(GuestMemory& mem, std::unique_ptr<Disk> disk, std::string serial, bool read_only)
    : mem_(mem),
      disk_(std::move(disk)),
      serial_(std::move(serial)),
      read_only_(read_only || disk_->read_only()),
      discard_(!read_only_ && disk_->discard(0, 0) == 0) {
  if (serial_.size() > kIdBytes) serial_.resize(kIdBytes);
  // struct virtio_blk_config (virtio 1.2 §5.2.4), the fields we offer.
  put<uint64_t>(config_, 0, capacity_sectors());
  put<uint32_t>(config_, 12, kSegMax);
  // Logical block 512 bytes: a guest filesystem with 1 KiB blocks still
  // mounts. Physical block 4096 (2^3 sectors) tells the guest to align its
  // I/O to the overlay's block, so writes rarely need a copy-up.
  put<uint32_t>(config_, 20, kSectorSize);
  put<uint8_t>(config_, 24, 3);    // physical_block_exp
  put<uint16_t>(config_, 26, 8);   // min_io_size, in logical blocks
  put<uint32_t>(config_, 28, 8);   // opt_io_size, in logical blocks
  if (discard_) {
    put<uint32_t>(config_, 36, kMaxDiscardSectors);
    put<uint32_t>(config_, 40, kMaxDiscardSegments);
    put<uint32_t>(config_, 44, kDiscardAlignment);
  }
}

uint64_t VirtioBlkDevice::device_features() const {
  uint64_t f = virtio::kFRingFeatures | kFSegMax | kFBlkSize | kFFlush | kFTopology;
  if (read_only_) f |= kFRo;
  if (discard_) f |= kFDiscard;
  return f;
}

void VirtioBlkDevice::read_config(uint64_t offset, uint8_t* data, size_t len) {
  for (size_t i = 0; i < len; i++) data[i] = offset + i < config_.size() ? config_[offset + i] : 0;
}

void VirtioBlkDevice::queue_notify(uint32_t index) {
  if (index != 0 || !transport_) return;
  serve_queue(*transport_, mem_, 0, chain_, [this](const DescriptorChain& chain) { return handle(chain); });
}

bool VirtioBlkDevice::range_ok(uint64_t sector, uint64_t len) const {
  if (len % kSectorSize) return false;
  uint64_t cap = capacity_sectors();
  return sector <= cap && len / kSectorSize <= cap - sector;
}

uint32_t VirtioBlkDevice::handle(const DescriptorChain& chain) {
  RequestHeader hdr;
  // Without a header or a status byte there is nowhere to answer: hand the
  // buffers back untouched (a driver bug, not something to crash on).
  if (chain.writable_bytes() < 1 || !chain.read(mem_, 0, &hdr, sizeof hdr)) return 0;
  uint64_t out_len = chain.readable_bytes() - sizeof hdr;  // payload the driver gave us
  uint64_t in_len = chain.writable_bytes() - 1;             // room for data before the status byte
  uint8_t status = kSOk;
  uint64_t written = 0;
  switch (hdr.type) {
    case kTIn:
      if (!range_ok(hdr.sector, in_len)) {
        status = kSIoErr;
        break;
      }
      status = do_in(chain, hdr.sector * kSectorSize, in_len);
      if (status == kSOk) written = in_len;
      break;
    case kTOut:
      if (read_only_ || !range_ok(hdr.sector, out_len)) {
        status = kSIoErr;
        break;
      }
      status = do_out(chain, hdr.sector * kSectorSize, out_len);
      break;
    case kTFlush:
      status = disk_->flush() == 0 ? kSOk : kSIoErr;
      break;
    case kTGetId: {
      uint8_t id[kIdBytes] = {};
      std::memcpy(id, serial_.data(), serial_.size());
      size_t n = static_cast<size_t>(std::min<uint64_t>(kIdBytes, in_len));
      if (!chain.write(mem_, 0, id, n)) status = kSIoErr;
      else written = n;
      break;
    }
    case kTDiscard:
      status = discard_ ? do_discard(chain, out_len) : kSUnsupp;
      break;
    default:
      status = kSUnsupp;
      break;
  }
  chain.write(mem_, chain.writable_bytes() - 1, &status, 1);
  return static_cast<uint32_t>(written + 1);
}

uint8_t VirtioBlkDevice::do_in(const DescriptorChain& chain, uint64_t offset, uint64_t len) {
  for (const auto& b : chain.writable()) {
    if (len == 0) break;
    size_t n = static_cast<size_t>(std::min<uint64_t>(b.len, len));  // the last byte is the status
    uint8_t* p = mem_.host_ptr(b.gpa, n);
    if (!p || disk_->read(offset, p, n) != 0) return kSIoErr;
    mem_.mark_dirty(b.gpa, n);
    offset += n;
    len -= n;
  }
  return kSOk;
}

uint8_t VirtioBlkDevice::do_out(const DescriptorChain& chain, uint64_t offset, uint64_t len) {
  uint64_t skip = sizeof(RequestHeader);
  for (const auto& b : chain.readable()) {
    if (len == 0) break;
    if (skip >= b.len) {
      skip -= b.len;
      continue;
    }
    size_t n = static_cast<size_t>(std::min<uint64_t>(b.len - skip, len));
    const uint8_t* p = mem_.host_ptr(b.gpa + skip, n);
    if (!p || disk_->write(offset, p, n) != 0) return kSIoErr;
    skip = 0;
    offset += n;
    len -= n;
  }
  return kSOk;
}

uint8_t VirtioBlkDevice::do_discard(const DescriptorChain& chain, uint64_t len) {
  if (len == 0 || len % sizeof(DiscardSegment) || len / sizeof(DiscardSegment) > kMaxDiscardSegments) return kSIoErr;
  // Check every segment before acting on any, so a bad request changes nothing.
  DiscardSegment segs[kMaxDiscardSegments];
  size_t n = len / sizeof(DiscardSegment);
  for (size_t i = 0; i < n; i++) {
    if (!chain.read(mem_, sizeof(RequestHeader) + i * sizeof(DiscardSegment), &segs[i], sizeof segs[i])) return kSIoErr;
    if (segs[i].flags != 0) return kSUnsupp;  // the spec's answer to "unmap" on DISCARD
    if (segs[i].num_sectors > kMaxDiscardSectors ||
        !range_ok(segs[i].sector, uint64_t{segs[i].num_sectors} * kSectorSize))
      return kSIoErr;
  }
  for (size_t i = 0; i < n; i++)
    if (disk_->discard(segs[i].sector * kSectorSize, uint64_t{segs[i].num_sectors} * kSectorSize) != 0) return kSIoErr;
  return kSOk;
}

void VirtioBlkDevice::save(StateWriter& out) const {
  out.header("virtio-blk", 1);
  out.u64(capacity_sectors());
  out.boolean(read_only_);
}

void VirtioBlkDevice::restore(StateReader& in) {
  in.expect_header("virtio-blk", 1, 1);
  uint64_t cap = in.u64();
  bool ro = in.boolean();
  if (cap > capacity_sectors())
    StateReader::fail("virtio-blk: saved for a disk of " + std::to_string(cap) + " sectors, larger than this one (" +
                      std::to_string(capacity_sectors()) + "): a disk never shrinks");
  if (ro != read_only_) StateReader::fail("virtio-blk: saved with another read-only setting");
  // A smaller saved capacity: the disk was grown on this restore (never by a
  // mismatch of files: the machine opens the disk at the size its spec saved,
  // or a larger one asked for explicitly).
  grown_since_save_ = cap < capacity_sectors();
}

}  // namespace torpor
