#include "base/guest_memory.h"

namespace torpor {

GuestMemory::GuestMemory(std::vector<MemoryRegion> regions) {
  for (const auto& r : regions) add_region(r);
}

bool GuestMemory::add_region(const MemoryRegion& r) {
  if (r.size == 0 || r.host == nullptr || r.gpa % kPageSize || r.size % kPageSize) return false;
  if (r.gpa + r.size < r.gpa) return false;  // wraps
  for (const auto& t : tracked_) {
    const auto& o = t.region;
    if (r.gpa < o.gpa + o.size && o.gpa < r.gpa + r.size) return false;
  }
  Tracked t;
  t.region = r;
  t.dirty_words = (r.size / kPageSize + 63) / 64;
  t.dirty = std::make_unique<std::atomic<uint64_t>[]>(t.dirty_words);
  for (size_t i = 0; i < t.dirty_words; i++) t.dirty[i].store(0, std::memory_order_relaxed);
  tracked_.push_back(std::move(t));
  regions_.push_back(r);
  return true;
}

const GuestMemory::Tracked* GuestMemory::find(uint64_t gpa, size_t len) const {
  for (const auto& t : tracked_) {
    const auto& r = t.region;
    if (gpa < r.gpa) continue;
    uint64_t off = gpa - r.gpa;
    if (off >= r.size) continue;
    // len may be 0: an empty access inside a region is allowed.
    if (len > r.size - off) return nullptr;
    return &t;
  }
  return nullptr;
}

bool GuestMemory::read(uint64_t gpa, void* dst, size_t len) const {
  const Tracked* t = find(gpa, len);
  if (!t) return false;
  if (len) std::memcpy(dst, t->region.host + (gpa - t->region.gpa), len);
  return true;
}

bool GuestMemory::write(uint64_t gpa, const void* src, size_t len) {
  const Tracked* t = find(gpa, len);
  if (!t) return false;
  if (len) {
    std::memcpy(t->region.host + (gpa - t->region.gpa), src, len);
    mark_dirty_in(*t, gpa - t->region.gpa, len);
  }
  return true;
}

uint8_t* GuestMemory::host_ptr(uint64_t gpa, size_t len) const {
  const Tracked* t = find(gpa, len);
  return t ? t->region.host + (gpa - t->region.gpa) : nullptr;
}

void GuestMemory::mark_dirty(uint64_t gpa, size_t len) {
  const Tracked* t = find(gpa, len);
  if (t && len) mark_dirty_in(*t, gpa - t->region.gpa, len);
}

void GuestMemory::mark_dirty_in(const Tracked& t, uint64_t offset, size_t len) {
  uint64_t first = offset / kPageSize;
  uint64_t last = (offset + len - 1) / kPageSize;
  for (uint64_t p = first; p <= last; p++)
    t.dirty[p / 64].fetch_or(uint64_t{1} << (p % 64), std::memory_order_relaxed);
}

std::vector<uint64_t> GuestMemory::take_dirty(size_t index) {
  std::vector<uint64_t> out;
  if (index >= tracked_.size()) return out;
  auto& t = tracked_[index];
  out.resize(t.dirty_words);
  for (size_t i = 0; i < t.dirty_words; i++) out[i] = t.dirty[i].exchange(0, std::memory_order_relaxed);
  return out;
}

uint64_t GuestMemory::total_size() const {
  uint64_t n = 0;
  for (const auto& r : regions_) n += r.size;
  return n;
}

}  // namespace torpor
