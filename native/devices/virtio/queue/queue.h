// The device side of a split virtqueue (virtio 1.2 §2.7).
//
// The driver (the untrusted guest) owns the descriptor table and the
// available ring; the device owns the used ring. Every access goes through
// GuestMemory, so a ring or buffer outside RAM (or in an MMIO hole) is
// refused, never dereferenced.
//
// pop() hands out one validated descriptor chain at a time. A chain is
// rejected, and the queue marked broken, when it
//   - has a head or `next` index >= the queue size,
//   - is longer than the queue size (which is also how a loop is caught),
//   - has a zero-length buffer or a buffer not wholly inside one RAM region,
//   - has a device-readable buffer after a device-writable one,
//   - uses an indirect table that is empty, not a multiple of 16 bytes, more
//     than kMaxIndirect entries long, outside RAM, nested, combined with NEXT,
//     or offered when VIRTIO_RING_F_INDIRECT_DESC was not negotiated,
//   - or when the available index moved by more than the queue size.
// A broken queue returns PopStatus::kBroken from then on; the device calls
// VirtioTransport::fail(), which sets DEVICE_NEEDS_RESET, instead of
// crashing or guessing.
//
// Not thread-safe: the transport's lock serialises every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "snapshot/state_io.h"
#include "base/guest_memory.h"

namespace torpor {

namespace virtio {
inline constexpr uint16_t kDescFNext = 1;
inline constexpr uint16_t kDescFWrite = 2;
inline constexpr uint16_t kDescFIndirect = 4;
inline constexpr uint16_t kAvailFNoInterrupt = 1;
inline constexpr uint16_t kUsedFNoNotify = 1;
inline constexpr uint32_t kMaxQueueSize = 32768;
// Longest indirect table we accept (Linux allocates one entry per segment;
// our devices advertise far fewer segments than this).
inline constexpr uint32_t kMaxIndirect = 1024;

// Guest-visible layouts (little-endian; x86 only).
struct Descriptor {
  uint64_t addr;
  uint32_t len;
  uint16_t flags;
  uint16_t next;
};
static_assert(sizeof(Descriptor) == 16);
struct UsedElem {
  uint32_t id;
  uint32_t len;
};
static_assert(sizeof(UsedElem) == 8);
}  // namespace virtio

// One guest buffer of a chain, already checked to lie inside RAM.
struct VirtioBuffer {
  uint64_t gpa = 0;
  uint32_t len = 0;
};

// A validated descriptor chain: its device-readable buffers (in order), then
// its device-writable ones. Reused across pop() calls to avoid allocation.
class DescriptorChain {
 public:
  uint16_t head() const { return head_; }
  const std::vector<VirtioBuffer>& readable() const { return readable_; }
  const std::vector<VirtioBuffer>& writable() const { return writable_; }
  uint64_t readable_bytes() const { return readable_bytes_; }
  uint64_t writable_bytes() const { return writable_bytes_; }

  // Copies bytes [offset, offset+len) of the concatenated readable buffers
  // into dst. False when the chain is shorter.
  bool read(const GuestMemory& mem, uint64_t offset, void* dst, size_t len) const;
  // Copies src into bytes [offset, offset+len) of the concatenated writable
  // buffers (marking the pages dirty). False when the chain is shorter.
  bool write(GuestMemory& mem, uint64_t offset, const void* src, size_t len) const;

  void clear();

 private:
  friend class Virtqueue;
  uint16_t head_ = 0;
  std::vector<VirtioBuffer> readable_;
  std::vector<VirtioBuffer> writable_;
  uint64_t readable_bytes_ = 0;
  uint64_t writable_bytes_ = 0;
};

enum class PopStatus { kEmpty, kChain, kBroken };

class Virtqueue {
 public:
  explicit Virtqueue(uint16_t max_size);

  // --- configuration, written by the transport from the driver's registers
  uint16_t max_size() const { return max_size_; }
  uint16_t size() const { return size_; }
  void set_size(uint16_t size) { size_ = size; }
  uint64_t desc_table() const { return desc_; }
  uint64_t avail_ring() const { return avail_; }
  uint64_t used_ring() const { return used_; }
  void set_desc_table(uint64_t gpa) { desc_ = gpa; }
  void set_avail_ring(uint64_t gpa) { avail_ = gpa; }
  void set_used_ring(uint64_t gpa) { used_ = gpa; }
  bool ready() const { return ready_; }
  void set_ready(bool ready) { ready_ = ready; }
  // From the negotiated features (the transport calls it at FEATURES_OK).
  void set_features(bool event_idx, bool indirect) {
    event_idx_ = event_idx;
    indirect_ = indirect;
  }
  bool event_idx() const { return event_idx_; }

  // Checks the configuration before use: size a non-zero power of two no
  // larger than max_size(), rings aligned (16/2/4) and wholly inside RAM.
  // Returns nullptr when usable, else why not.
  const char* validate(const GuestMemory& mem) const;
  // Back to the power-on state (size = max_size, nothing ready, indices 0).
  void reset();

  // --- device side
  // Takes the next available chain. kEmpty when the driver has published
  // nothing new; with EVENT_IDX it then also publishes avail_event (so the
  // driver kicks on its next buffer) and re-checks once after a full fence,
  // so a buffer published concurrently is never missed.
  PopStatus pop(GuestMemory& mem, DescriptorChain& out);
  // Gives the most recently popped chain back (the device cannot serve it
  // yet, e.g. vsock has nothing to put in an rx buffer).
  void undo_pop();
  // True when the driver has published a chain not yet popped.
  bool has_available(const GuestMemory& mem);
  // Returns a chain to the driver with `len` bytes written into it. False
  // (and the queue broken) when the used ring is not in RAM.
  bool add_used(GuestMemory& mem, uint16_t head, uint32_t len);
  // Whether the driver wants an interrupt for the used entries added since
  // the last call that returned true. With EVENT_IDX: full fence between
  // publishing used->idx (add_used) and reading used_event, then the
  // vring_need_event test; without: !(avail->flags & NO_INTERRUPT).
  bool needs_interrupt(const GuestMemory& mem);

  bool broken() const { return !error_.empty(); }
  const std::string& error() const { return error_; }
  uint16_t next_avail() const { return next_avail_; }
  uint16_t next_used() const { return next_used_; }

  // Queue state (configuration and indices). restore() validates: a size that
  // is not a power of two or above max_size() throws SNAPSHOT_INVALID.
  void save(StateWriter& out) const;
  void restore(StateReader& in);

 private:
  PopStatus fail(const char* why);
  bool read_avail_idx(const GuestMemory& mem, uint16_t* idx);
  PopStatus walk(GuestMemory& mem, uint16_t head, DescriptorChain& out);
  bool add_buffer(const GuestMemory& mem, const virtio::Descriptor& d, DescriptorChain& out);

  uint16_t max_size_;
  uint16_t size_;
  uint64_t desc_ = 0, avail_ = 0, used_ = 0;
  bool ready_ = false;
  bool event_idx_ = false;
  bool indirect_ = false;
  uint16_t next_avail_ = 0;     // next avail ring slot the device reads
  uint16_t next_used_ = 0;      // next used ring slot the device writes (== used->idx)
  uint16_t signalled_used_ = 0; // used->idx at the last interrupt (EVENT_IDX)
  bool signalled_valid_ = false;
  std::string error_;
};

}  // namespace torpor
