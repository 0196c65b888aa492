// Guest-physical memory as the VMM sees it.
//
// The guest is untrusted: every guest-physical read or write made by the VMM
// or by a device goes through this one bounds-checked accessor. An access
// that is not wholly inside one region fails (returns false / nullptr); it
// never touches host memory outside the guest's mapping.
//
// Writes made through this class are recorded in a per-region bitmap of
// dirtied pages, because KVM's dirty log does not see writes the VMM itself
// makes (virtio used rings, block reads, vsock rx buffers). Diff snapshots OR
// this bitmap with KVM's.
//
// The same class backs the unit tests: they build it over an ordinary buffer
// (fake guest memory), so device logic is tested without KVM.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

namespace torpor {

inline constexpr uint64_t kPageSize = 4096;

struct MemoryRegion {
  uint64_t gpa = 0;        // guest-physical base, page aligned
  uint64_t size = 0;       // bytes, page aligned
  uint8_t* host = nullptr; // host mapping of [gpa, gpa + size)
};

class GuestMemory {
 public:
  GuestMemory() = default;
  explicit GuestMemory(std::vector<MemoryRegion> regions);
  GuestMemory(const GuestMemory&) = delete;
  GuestMemory& operator=(const GuestMemory&) = delete;

  // Adds a region; fails (false) when it overlaps another or is not page aligned.
  bool add_region(const MemoryRegion& region);

  // Copies len bytes from guest memory; false when [gpa, gpa+len) is not
  // inside one region (including on overflow).
  bool read(uint64_t gpa, void* dst, size_t len) const;
  // Copies len bytes into guest memory and marks the pages dirty.
  bool write(uint64_t gpa, const void* src, size_t len);

  template <typename T>
  std::optional<T> read_obj(uint64_t gpa) const {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    if (!read(gpa, &value, sizeof(T))) return std::nullopt;
    return value;
  }
  template <typename T>
  bool write_obj(uint64_t gpa, const T& value) {
    static_assert(std::is_trivially_copyable_v<T>);
    return write(gpa, &value, sizeof(T));
  }

  // Host pointer to [gpa, gpa+len) for zero-copy I/O (preadv into guest
  // buffers). nullptr when out of bounds. A caller that writes through the
  // pointer must call mark_dirty(gpa, len).
  uint8_t* host_ptr(uint64_t gpa, size_t len) const;
  bool contains(uint64_t gpa, size_t len) const { return find(gpa, len) != nullptr; }

  void mark_dirty(uint64_t gpa, size_t len);
  // Snapshot support: the pages the VMM wrote, per region, one bit per page.
  // take_dirty returns the bitmap words and clears them.
  std::vector<uint64_t> take_dirty(size_t region_index);
  const std::vector<MemoryRegion>& regions() const { return regions_; }
  uint64_t total_size() const;

 private:
  struct Tracked {
    MemoryRegion region;
    std::unique_ptr<std::atomic<uint64_t>[]> dirty;  // one bit per page
    size_t dirty_words = 0;
  };
  const Tracked* find(uint64_t gpa, size_t len) const;
  // Marks the pages of [offset, offset + len) of t's region dirty; len > 0, bounds checked by
  // the caller's find().
  static void mark_dirty_in(const Tracked& t, uint64_t offset, size_t len);

  std::vector<MemoryRegion> regions_;
  std::vector<Tracked> tracked_;
};

}  // namespace torpor
