#include "base/event_loop.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <condition_variable>
#include <exception>
#include <memory>

#include "common/error.h"

namespace torpor {

EventLoop::EventLoop() {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epfd_ < 0) throw_sys_error(code::kInternal, "epoll_create1");
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    int e = errno;
    close(epfd_);
    throw_sys_error(code::kInternal, "eventfd", e);
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);
}

EventLoop::~EventLoop() {
  stop();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epfd_ >= 0) close(epfd_);
}

void EventLoop::start(std::function<void()> on_thread_start) {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_ || stopping_) return;
  started_ = true;
  thread_ = std::thread([this, hook = std::move(on_thread_start)] {
    if (hook) {
      try {
        hook();
      } catch (...) {
      }
    }
    run();
  });
}

void EventLoop::stop() {
  bool never_started;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    never_started = !started_;
  }
  uint64_t one = 1;
  ssize_t ignored = write(wake_fd_, &one, sizeof one);
  (void)ignored;
  if (thread_.joinable() && !on_loop_thread()) thread_.join();
  // A loop that never ran still owes its posted closures a run, as a
  // stopping loop gives them: they close fds handed over to the I/O thread
  // and settle completions (a vsock connect), which would otherwise leak or
  // never settle.
  if (never_started) drain_posted();
}

bool EventLoop::add(int fd, uint32_t events, Callback cb) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    callbacks_[fd] = std::make_shared<Callback>(std::move(cb));
  }
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    std::lock_guard<std::mutex> lock(mu_);
    callbacks_.erase(fd);
    return false;
  }
  return true;
}

bool EventLoop::modify(int fd, uint32_t events) {
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = fd;
  return epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) == 0;
}

void EventLoop::remove(int fd) {
  epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    callbacks_.erase(fd);
  }
  // Wait for a callback that may be running right now, unless we are it.
  if (std::this_thread::get_id() != dispatch_thread_) {
    std::lock_guard<std::mutex> wait(dispatch_mu_);
  }
}

bool EventLoop::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    posted_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  ssize_t ignored = write(wake_fd_, &one, sizeof one);
  (void)ignored;
  return true;
}

void EventLoop::run_sync(const std::function<void()>& fn) {
  bool inline_run;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inline_run = !started_ || stopping_ || on_loop_thread();
  }
  if (inline_run) {
    fn();
    return;
  }
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  bool posted = post([&] {
    // An exception must not skip the wake-up below (the caller would wait
    // for ever): it is carried back to the caller instead.
    std::exception_ptr e;
    try {
      fn();
    } catch (...) {
      e = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(m);
    error = e;
    done = true;
    cv.notify_one();
  });
  if (!posted) {
    fn();
    return;
  }
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return done; });
  if (error) std::rethrow_exception(error);
}

size_t EventLoop::posted_count() {
  std::lock_guard<std::mutex> lock(mu_);
  return posted_.size();
}

void EventLoop::drain_posted() {
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    work.swap(posted_);
  }
  for (auto& fn : work) {
    try {
      fn();
    } catch (...) {
    }
  }
}

void EventLoop::run_pending() {
  dispatch_ready(0);
  drain_posted();
}

bool EventLoop::dispatch_ready(int timeout_ms) {
  epoll_event events[64];
  int n = epoll_wait(epfd_, events, 64, timeout_ms);
  if (n < 0) return errno == EINTR;
  for (int i = 0; i < n; i++) {
    int fd = events[i].data.fd;
    if (fd == wake_fd_) {
      uint64_t v;
      ssize_t ignored = read(wake_fd_, &v, sizeof v);
      (void)ignored;
      continue;
    }
    std::shared_ptr<Callback> cb;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return false;
      auto it = callbacks_.find(fd);
      if (it == callbacks_.end()) continue;
      cb = it->second;
    }
    std::lock_guard<std::mutex> running(dispatch_mu_);
    dispatch_thread_ = std::this_thread::get_id();
    {
      // Re-check: remove() may have run between lookup and lock.
      std::lock_guard<std::mutex> lock(mu_);
      if (!callbacks_.count(fd)) {
        dispatch_thread_ = std::thread::id{};
        continue;
      }
    }
    // Nothing may escape this thread (std::terminate); devices fail
    // themselves on their own errors, this is the last line.
    try {
      (*cb)(events[i].events);
    } catch (...) {
    }
    dispatch_thread_ = std::thread::id{};
  }
  return true;
}

void EventLoop::run() {
  for (;;) {
    if (!dispatch_ready(-1)) break;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
    }
    drain_posted();
  }
  // Run closures posted before stop so waiters in run_sync are released.
  drain_posted();
}

}  // namespace torpor
