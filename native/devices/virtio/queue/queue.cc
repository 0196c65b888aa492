#include "devices/virtio/queue/queue.h"

#include <algorithm>
#include <atomic>

namespace torpor {

using virtio::Descriptor;

namespace {

bool is_power_of_two(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }

// Ring indices are shared with the guest's vCPUs while we run: read and
// write them as single aligned 16-bit atomics (validate() checked the
// alignment), never as a byte-wise memcpy that could tear.
bool load_u16(const GuestMemory& mem, uint64_t gpa, uint16_t* v) {
  uint8_t* p = mem.host_ptr(gpa, 2);
  if (!p) return false;
  *v = __atomic_load_n(reinterpret_cast<uint16_t*>(p), __ATOMIC_RELAXED);
  return true;
}

bool store_u16(GuestMemory& mem, uint64_t gpa, uint16_t v) {
  uint8_t* p = mem.host_ptr(gpa, 2);
  if (!p) return false;
  __atomic_store_n(reinterpret_cast<uint16_t*>(p), v, __ATOMIC_RELAXED);
  mem.mark_dirty(gpa, 2);
  return true;
}

}  // namespace

// ---- DescriptorChain

void DescriptorChain::clear() {
  head_ = 0;
  readable_.clear();
  writable_.clear();
  readable_bytes_ = 0;
  writable_bytes_ = 0;
}

bool DescriptorChain::read(const GuestMemory& mem, uint64_t offset, void* dst, size_t len) const {
  auto* out = static_cast<uint8_t*>(dst);
  for (const auto& b : readable_) {
    if (len == 0) break;
    if (offset >= b.len) {
      offset -= b.len;
      continue;
    }
    size_t n = std::min<uint64_t>(len, b.len - offset);
    if (!mem.read(b.gpa + offset, out, n)) return false;
    out += n;
    len -= n;
    offset = 0;
  }
  return len == 0;
}

bool DescriptorChain::write(GuestMemory& mem, uint64_t offset, const void* src, size_t len) const {
  const auto* in = static_cast<const uint8_t*>(src);
  for (const auto& b : writable_) {
    if (len == 0) break;
    if (offset >= b.len) {
      offset -= b.len;
      continue;
    }
    size_t n = std::min<uint64_t>(len, b.len - offset);
    if (!mem.write(b.gpa + offset, in, n)) return false;
    in += n;
    len -= n;
    offset = 0;
  }
  return len == 0;
}

// ---- Virtqueue

Virtqueue::Virtqueue(uint16_t max_size) : max_size_(max_size), size_(max_size) {}

const char* Virtqueue::validate(const GuestMemory& mem) const {
  if (!is_power_of_two(size_) || size_ > max_size_) return "queue size is not a power of two up to QueueNumMax";
  if (desc_ % 16 || avail_ % 2 || used_ % 4) return "queue ring is misaligned";
  if (!mem.contains(desc_, 16u * size_)) return "descriptor table is outside RAM";
  // flags, idx, ring[size], used_event
  if (!mem.contains(avail_, 6u + 2u * size_)) return "available ring is outside RAM";
  // flags, idx, ring[size], avail_event
  if (!mem.contains(used_, 6u + 8u * size_)) return "used ring is outside RAM";
  return nullptr;
}

void Virtqueue::reset() {
  size_ = max_size_;
  desc_ = avail_ = used_ = 0;
  ready_ = false;
  event_idx_ = false;
  indirect_ = false;
  next_avail_ = 0;
  next_used_ = 0;
  signalled_used_ = 0;
  signalled_valid_ = false;
  error_.clear();
}

PopStatus Virtqueue::fail(const char* why) {
  if (error_.empty()) error_ = why;
  return PopStatus::kBroken;
}

bool Virtqueue::read_avail_idx(const GuestMemory& mem, uint16_t* idx) { return load_u16(mem, avail_ + 2, idx); }

bool Virtqueue::has_available(const GuestMemory& mem) {
  uint16_t idx;
  if (broken() || !ready_ || !read_avail_idx(mem, &idx)) return false;
  return idx != next_avail_;
}

PopStatus Virtqueue::pop(GuestMemory& mem, DescriptorChain& out) {
  if (broken()) return PopStatus::kBroken;
  if (!ready_ || size_ == 0) return PopStatus::kEmpty;
  uint16_t avail_idx;
  if (!read_avail_idx(mem, &avail_idx)) return fail("available ring is outside RAM");
  uint16_t pending = static_cast<uint16_t>(avail_idx - next_avail_);
  if (pending == 0 && event_idx_) {
    // Ask for a kick on the next buffer, then look again: the driver may
    // have published one after our read and before it saw avail_event.
    if (!store_u16(mem, used_ + 4 + 8u * size_, next_avail_)) return fail("used ring is outside RAM");
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!read_avail_idx(mem, &avail_idx)) return fail("available ring is outside RAM");
    pending = static_cast<uint16_t>(avail_idx - next_avail_);
  }
  if (pending == 0) return PopStatus::kEmpty;
  if (pending > size_) return fail("available index moved by more than the queue size");
  // The ring entry and the descriptors were written before avail->idx.
  std::atomic_thread_fence(std::memory_order_acquire);
  uint16_t head;
  if (!load_u16(mem, avail_ + 4 + 2u * (next_avail_ % size_), &head)) return fail("available ring is outside RAM");
  next_avail_++;
  return walk(mem, head, out);
}

void Virtqueue::undo_pop() { next_avail_--; }

bool Virtqueue::add_buffer(const GuestMemory& mem, const Descriptor& d, DescriptorChain& out) {
  if (d.len == 0) {
    fail("zero-length descriptor");
    return false;
  }
  if (!mem.contains(d.addr, d.len)) {
    fail("descriptor points outside RAM");
    return false;
  }
  if (d.flags & virtio::kDescFWrite) {
    out.writable_.push_back({d.addr, d.len});
    out.writable_bytes_ += d.len;
  } else {
    if (!out.writable_.empty()) {
      fail("device-readable descriptor after a device-writable one");
      return false;
    }
    out.readable_.push_back({d.addr, d.len});
    out.readable_bytes_ += d.len;
  }
  return true;
}

PopStatus Virtqueue::walk(GuestMemory& mem, uint16_t head, DescriptorChain& out) {
  out.clear();
  out.head_ = head;
  if (head >= size_) return fail("descriptor index out of range");
  uint64_t table = desc_;
  uint32_t table_size = size_;
  bool indirect = false;
  uint32_t idx = head;
  uint32_t count = 0;
  for (;;) {
    // A chain visits each descriptor of its table at most once; one more
    // means a loop (or a chain the spec forbids), either way bounded here.
    if (++count > table_size) return fail("descriptor chain is longer than the queue (loop?)");
    Descriptor d;
    if (!mem.read(table + 16u * idx, &d, sizeof d)) return fail("descriptor table is outside RAM");
    if (d.flags & virtio::kDescFIndirect) {
      if (!indirect_) return fail("indirect descriptor without VIRTIO_RING_F_INDIRECT_DESC");
      if (indirect) return fail("nested indirect descriptor");
      if (count != 1) return fail("indirect descriptor inside a chain");
      if (d.flags & virtio::kDescFNext) return fail("indirect descriptor with NEXT");
      if (d.len == 0 || d.len % 16 || d.len / 16 > virtio::kMaxIndirect) return fail("bad indirect table length");
      if (!mem.contains(d.addr, d.len)) return fail("indirect table is outside RAM");
      table = d.addr;
      table_size = d.len / 16;
      indirect = true;
      idx = 0;
      count = 0;
      continue;
    }
    if (!add_buffer(mem, d, out)) return PopStatus::kBroken;
    if (!(d.flags & virtio::kDescFNext)) break;
    idx = d.next;
    if (idx >= table_size) return fail("descriptor index out of range");
  }
  return PopStatus::kChain;
}

bool Virtqueue::add_used(GuestMemory& mem, uint16_t head, uint32_t len) {
  if (broken() || size_ == 0) return false;
  virtio::UsedElem e{head, len};
  if (!mem.write_obj(used_ + 4 + 8u * (next_used_ % size_), e)) {
    fail("used ring is outside RAM");
    return false;
  }
  // The element must be visible before the index that publishes it.
  std::atomic_thread_fence(std::memory_order_release);
  next_used_++;
  if (!store_u16(mem, used_ + 2, next_used_)) {
    fail("used ring is outside RAM");
    return false;
  }
  return true;
}

bool Virtqueue::needs_interrupt(const GuestMemory& mem) {
  if (broken() || size_ == 0) return false;
  // Full fence: our used->idx store must be globally visible before we read
  // the driver's suppression state, or the driver may go to sleep waiting
  // for an interrupt we decided not to send (store->load ordering).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!event_idx_) {
    uint16_t flags = 0;
    if (!load_u16(mem, avail_, &flags)) return true;
    return !(flags & virtio::kAvailFNoInterrupt);
  }
  uint16_t used_event = 0;
  if (!load_u16(mem, avail_ + 4 + 2u * size_, &used_event)) return true;
  uint16_t now = next_used_;
  uint16_t old = signalled_used_;
  bool valid = signalled_valid_;
  signalled_used_ = now;
  signalled_valid_ = true;
  if (!valid) return true;
  // vring_need_event(): did used->idx step past used_event since `old`?
  return static_cast<uint16_t>(now - used_event - 1) < static_cast<uint16_t>(now - old);
}

void Virtqueue::save(StateWriter& out) const {
  out.header("virtqueue", 1);
  out.u16(max_size_);
  out.u16(size_);
  out.u64(desc_);
  out.u64(avail_);
  out.u64(used_);
  out.boolean(ready_);
  out.boolean(event_idx_);
  out.boolean(indirect_);
  out.u16(next_avail_);
  out.u16(next_used_);
  out.u16(signalled_used_);
  out.boolean(signalled_valid_);
  out.str(error_);
}

void Virtqueue::restore(StateReader& in) {
  in.expect_header("virtqueue", 1, 1);
  uint16_t max_size = in.u16();
  if (max_size != max_size_) StateReader::fail("virtqueue: saved QueueNumMax differs from the device's");
  uint16_t size = in.u16();
  if (size > max_size_ || (size != 0 && !is_power_of_two(size)))
    StateReader::fail("virtqueue: bad queue size");
  uint64_t desc = in.u64(), avail = in.u64(), used = in.u64();
  bool ready = in.boolean(), event_idx = in.boolean(), indirect = in.boolean();
  uint16_t next_avail = in.u16(), next_used = in.u16(), signalled = in.u16();
  bool signalled_valid = in.boolean();
  std::string error = in.str(256);
  if (ready && size == 0) StateReader::fail("virtqueue: ready with size 0");
  size_ = size;
  desc_ = desc;
  avail_ = avail;
  used_ = used;
  ready_ = ready;
  event_idx_ = event_idx;
  indirect_ = indirect;
  next_avail_ = next_avail;
  next_used_ = next_used;
  signalled_used_ = signalled;
  signalled_valid_ = signalled_valid;
  error_ = std::move(error);
}

}  // namespace torpor
