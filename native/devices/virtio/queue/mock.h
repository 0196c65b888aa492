// A driver-side virtqueue for tests: it plays the guest's virtio driver over
// fake guest memory, writing descriptors and the available ring and reading
// the used ring, so device code is tested without KVM or a guest kernel.
// It also writes deliberately malformed descriptors (raw access) for the
// negative tests. Header-only; used only by *_test.cc and fuzz targets.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "devices/virtio/queue/queue.h"
#include "base/guest_memory.h"

namespace torpor::testing {

// Plain memory posing as guest RAM: one region of `size` bytes at `gpa`.
struct FakeRam {
  explicit FakeRam(uint64_t size, uint64_t gpa = 0) : bytes(size), base(gpa) {
    mem.add_region({gpa, size, bytes.data()});
  }
  std::vector<uint8_t> bytes;
  uint64_t base;
  GuestMemory mem;
  uint8_t* at(uint64_t gpa) { return bytes.data() + (gpa - base); }

  // Zeroes the pages written through `mem` since the last call (its dirty bitmap), and clears
  // the bitmap: a fuzz target reuses one RAM across inputs at the cost of the pages an input
  // touched, not of the whole RAM. Bytes written through at() are not seen: write them
  // through mem (or mark them dirty) when the RAM is reset this way.
  void zero_dirty() {
    std::vector<uint64_t> words = mem.take_dirty(0);
    for (size_t w = 0; w < words.size(); w++)
      for (uint64_t bits = words[w]; bits != 0; bits &= bits - 1) {
        uint64_t page = w * 64 + static_cast<uint64_t>(__builtin_ctzll(bits));
        std::memset(bytes.data() + page * kPageSize, 0, kPageSize);
      }
  }
  // True when no byte is set: after zero_dirty, every write went through the dirty bitmap.
  bool all_zero() const {
    static const uint8_t zero[kPageSize] = {};
    for (size_t at = 0; at < bytes.size(); at += kPageSize)
      if (std::memcmp(bytes.data() + at, zero, std::min<size_t>(kPageSize, bytes.size() - at)) != 0) return false;
    return true;
  }
};

class MockDriverQueue {
 public:
  struct Seg {
    uint64_t gpa;
    uint32_t len;
    bool device_writes;  // VIRTQ_DESC_F_WRITE
  };

  // Lays the rings out from `base` (page aligned): descriptor table, then the
  // available ring, then the used ring on the next page boundary.
  MockDriverQueue(GuestMemory& mem, uint64_t base, uint16_t size) : mem_(mem), size_(size) {
    desc_ = base;
    avail_ = desc_ + 16u * size;
    used_ = (avail_ + 6 + 2u * size + 4095) & ~uint64_t{4095};
  }
  uint64_t desc_table() const { return desc_; }
  uint64_t avail_ring() const { return avail_; }
  uint64_t used_ring() const { return used_; }
  uint64_t end() const { return used_ + 6 + 8u * size_; }
  uint16_t size() const { return size_; }

  // Programs a device queue as the transport would from the driver's writes.
  void configure(Virtqueue& q, bool event_idx = false, bool indirect = true) const {
    q.set_size(size_);
    q.set_desc_table(desc_);
    q.set_avail_ring(avail_);
    q.set_used_ring(used_);
    q.set_features(event_idx, indirect);
    q.set_ready(true);
  }

  // Writes `segs` into consecutive free descriptors linked with NEXT and
  // publishes the head. Returns the head index.
  // (No vector is made of a braced list: fuzz targets post chains on every input, and an
  // allocation per chain was a visible share of their time under ASan.)
  uint16_t add_chain(std::initializer_list<Seg> segs) { return add_chain(segs.begin(), segs.size()); }
  uint16_t add_chain(const std::vector<Seg>& segs) { return add_chain(segs.data(), segs.size()); }
  uint16_t add_chain(const Seg* segs, size_t count) {
    uint16_t head = next_free_;
    for (size_t i = 0; i < count; i++) {
      uint16_t idx = static_cast<uint16_t>((next_free_ + i) % size_);
      uint16_t flags = segs[i].device_writes ? virtio::kDescFWrite : 0;
      uint16_t next = static_cast<uint16_t>((idx + 1) % size_);
      if (i + 1 < count) flags |= virtio::kDescFNext;
      write_desc(idx, {segs[i].gpa, segs[i].len, flags, next});
    }
    next_free_ = static_cast<uint16_t>((next_free_ + count) % size_);
    publish(head);
    return head;
  }

  // Writes `segs` as an indirect table at `table_gpa` and publishes one
  // descriptor pointing at it. Returns the head index.
  uint16_t add_indirect_chain(uint64_t table_gpa, const std::vector<Seg>& segs) {
    for (size_t i = 0; i < segs.size(); i++) {
      uint16_t flags = segs[i].device_writes ? virtio::kDescFWrite : 0;
      if (i + 1 < segs.size()) flags |= virtio::kDescFNext;
      virtio::Descriptor d{segs[i].gpa, segs[i].len, flags, static_cast<uint16_t>(i + 1)};
      mem_.write_obj(table_gpa + 16 * i, d);
    }
    uint16_t head = next_free_;
    write_desc(head, {table_gpa, static_cast<uint32_t>(16 * segs.size()), virtio::kDescFIndirect, 0});
    next_free_ = static_cast<uint16_t>((next_free_ + 1) % size_);
    publish(head);
    return head;
  }

  // Raw access for malformed chains.
  void write_desc(uint16_t index, const virtio::Descriptor& d) { mem_.write_obj(desc_ + 16u * index, d); }
  void publish(uint16_t head) {
    uint16_t idx = avail_idx();
    mem_.write_obj<uint16_t>(avail_ + 4 + 2u * (idx % size_), head);
    set_avail_idx(static_cast<uint16_t>(idx + 1));
  }
  uint16_t avail_idx() const { return *mem_.read_obj<uint16_t>(avail_ + 2); }
  void set_avail_idx(uint16_t idx) { mem_.write_obj<uint16_t>(avail_ + 2, idx); }
  void set_avail_flags(uint16_t flags) { mem_.write_obj<uint16_t>(avail_, flags); }
  // EVENT_IDX: the driver wants an interrupt once used->idx passes this.
  void set_used_event(uint16_t v) { mem_.write_obj<uint16_t>(avail_ + 4 + 2u * size_, v); }
  // Descriptors are reused from the start (after the device returned them).
  void recycle() { next_free_ = 0; }

  uint16_t used_idx() const { return *mem_.read_obj<uint16_t>(used_ + 2); }
  uint16_t used_flags() const { return *mem_.read_obj<uint16_t>(used_); }
  virtio::UsedElem used(uint16_t slot) const {
    return *mem_.read_obj<virtio::UsedElem>(used_ + 4 + 8u * (slot % size_));
  }
  // EVENT_IDX: the device wants a kick once avail->idx passes this.
  uint16_t avail_event() const { return *mem_.read_obj<uint16_t>(used_ + 4 + 8u * size_); }

 private:
  GuestMemory& mem_;
  uint16_t size_;
  uint64_t desc_ = 0, avail_ = 0, used_ = 0;
  uint16_t next_free_ = 0;
};

}  // namespace torpor::testing
