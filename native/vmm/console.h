// Where the guest's serial output goes: a bounded ring (consoleTail, exit
// reasons), an optional append-only log file, and a pending buffer the JS
// side drains in batches (one notification per burst, not per byte).
//
// Threading: write() arrives on vCPU threads (with the UART's lock held, so
// bytes keep their order); the readers on any thread. One mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "base/fd.h"

namespace torpor {

class Console {
 public:
  // on_pending runs (on the writing thread, without the lock) when the
  // pending buffer goes from empty to non-empty.
  Console(size_t ring_bytes, const std::string& log_path, std::function<void()> on_pending);

  void write(const uint8_t* data, size_t len);
  // The last max bytes printed (oldest first).
  std::vector<uint8_t> tail(size_t max) const;
  // Everything printed since the previous call (bounded: the oldest bytes of
  // a backlog beyond kPendingMax are dropped).
  std::vector<uint8_t> take_pending();
  uint64_t total_bytes() const;
  size_t capacity() const { return ring_.size(); }
  // History from before a restore: into the ring only (tail() shows it; it
  // is not pending output and not logged again).
  void seed(const uint8_t* data, size_t len);
  // Closes the log file (the machine was released); later writes only reach the ring.
  void close_log();

  static constexpr size_t kPendingMax = 1 << 20;

 private:
  mutable std::mutex mu_;
  std::vector<uint8_t> ring_;
  size_t ring_head_ = 0;  // next write position
  size_t ring_used_ = 0;
  std::vector<uint8_t> pending_;
  uint64_t total_ = 0;
  Fd log_;
  std::function<void()> on_pending_;
};

}  // namespace torpor
