#include "devices/bus.h"

#include <algorithm>
#include <mutex>

namespace torpor {

bool Bus::insert(uint64_t base, uint64_t len, BusDevice* dev) {
  if (len == 0 || dev == nullptr) return false;
  uint64_t last = base + (len - 1);  // inclusive end, so a range may end exactly at 2^64
  if (last < base) return false;
  std::unique_lock lock(mu_);
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), base,
                             [](const Range& r, uint64_t b) { return r.base < b; });
  // The next range must start after our last byte; the previous one must end before base.
  if (it != ranges_.end() && it->base <= last) return false;
  if (it != ranges_.begin()) {
    const Range& prev = *(it - 1);
    if (prev.base + (prev.len - 1) >= base) return false;
  }
  ranges_.insert(it, Range{base, len, dev});
  return true;
}

bool Bus::remove(uint64_t base) {
  std::unique_lock lock(mu_);
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), base,
                             [](const Range& r, uint64_t b) { return r.base < b; });
  if (it == ranges_.end() || it->base != base) return false;
  ranges_.erase(it);
  return true;
}

long Bus::find(uint64_t addr, size_t len) const {
  if (len == 0) return -1;
  uint64_t last = addr + (len - 1);
  if (last < addr) return -1;
  // The last range whose base is <= addr.
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), addr,
                             [](uint64_t a, const Range& r) { return a < r.base; });
  if (it == ranges_.begin()) return -1;
  --it;
  uint64_t range_last = it->base + (it->len - 1);
  if (addr > range_last || last > range_last) return -1;
  return static_cast<long>(it - ranges_.begin());
}

bool Bus::read(uint64_t addr, uint8_t* data, size_t len) const {
  std::shared_lock lock(mu_);
  long i = find(addr, len);
  if (i < 0) return false;
  const Range& r = ranges_[static_cast<size_t>(i)];
  r.dev->read(addr - r.base, data, len);
  return true;
}

bool Bus::write(uint64_t addr, const uint8_t* data, size_t len) const {
  std::shared_lock lock(mu_);
  long i = find(addr, len);
  if (i < 0) return false;
  const Range& r = ranges_[static_cast<size_t>(i)];
  r.dev->write(addr - r.base, data, len);
  return true;
}

BusDevice* Bus::device_at(uint64_t addr, uint64_t* base) const {
  std::shared_lock lock(mu_);
  long i = find(addr, 1);
  if (i < 0) return nullptr;
  const Range& r = ranges_[static_cast<size_t>(i)];
  if (base) *base = r.base;
  return r.dev;
}

size_t Bus::size() const {
  std::shared_lock lock(mu_);
  return ranges_.size();
}

}  // namespace torpor
