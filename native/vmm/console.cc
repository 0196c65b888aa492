#include "vmm/console.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "common/error.h"

namespace torpor {

Console::Console(size_t ring_bytes, const std::string& log_path, std::function<void()> on_pending)
    : ring_(std::max<size_t>(ring_bytes, 1)), on_pending_(std::move(on_pending)) {
  if (!log_path.empty()) {
    log_.reset(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!log_.valid()) throw_sys_error(code::kIo, "open console log " + log_path);
  }
}

void Console::write(const uint8_t* data, size_t len) {
  if (len == 0) return;
  bool notify;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < len; i++) {
      ring_[ring_head_] = data[i];
      ring_head_ = (ring_head_ + 1) % ring_.size();
    }
    ring_used_ = std::min(ring_.size(), ring_used_ + len);
    total_ += len;
    notify = pending_.empty();
    pending_.insert(pending_.end(), data, data + len);
    if (pending_.size() > kPendingMax) pending_.erase(pending_.begin(), pending_.end() - kPendingMax);
    if (log_.valid()) {
      // Small appends; a failing log never stops the guest.
      ssize_t n = ::write(log_.get(), data, len);
      (void)n;
    }
  }
  if (notify && on_pending_) on_pending_();
}

void Console::seed(const uint8_t* data, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < len; i++) {
    ring_[ring_head_] = data[i];
    ring_head_ = (ring_head_ + 1) % ring_.size();
  }
  ring_used_ = std::min(ring_.size(), ring_used_ + len);
}

std::vector<uint8_t> Console::tail(size_t max) const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = std::min(max, ring_used_);
  std::vector<uint8_t> out(n);
  size_t start = (ring_head_ + ring_.size() - n) % ring_.size();
  for (size_t i = 0; i < n; i++) out[i] = ring_[(start + i) % ring_.size()];
  return out;
}

std::vector<uint8_t> Console::take_pending() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<uint8_t> out;
  out.swap(pending_);
  return out;
}

void Console::close_log() {
  std::lock_guard<std::mutex> lock(mu_);
  log_.reset();
}

uint64_t Console::total_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

}  // namespace torpor
