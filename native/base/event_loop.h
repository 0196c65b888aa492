// The per-machine I/O thread's event loop: epoll over file descriptors
// (ioeventfds, vsock socketpair ends, block completion eventfds, console),
// plus a queue of closures posted from other threads.
//
// Callbacks run on the I/O thread only. add/modify/remove/post may be called
// from any thread. The loop never calls into JS: results reach JS through
// thread-safe functions called in non-blocking mode, or through fds libuv reads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace torpor {

class EventLoop {
 public:
  using Callback = std::function<void(uint32_t epoll_events)>;

  EventLoop();   // throws Error on epoll/eventfd failure
  ~EventLoop();  // stops and joins
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Spawns the I/O thread; on_thread_start runs on it first, before any
  // callback or posted closure (the machine names the thread and confines it
  // with seccomp there).
  void start(std::function<void()> on_thread_start = {});
  void stop();   // wakes the thread, runs no further fd callbacks, joins; idempotent.
                 // Closures posted before stop() still run (on the caller's
                 // thread when the loop never started).

  // events: EPOLLIN | EPOLLOUT | ...; level-triggered. The callback is
  // removed with the fd. Returns false when epoll refused the fd.
  bool add(int fd, uint32_t events, Callback cb);
  bool modify(int fd, uint32_t events);
  void remove(int fd);  // after return the callback is not running and never runs again
                        // (unless called from inside that callback, which is allowed)

  // Runs fn on the I/O thread soon. Returns false after stop().
  bool post(std::function<void()> fn);
  // Runs fn on the I/O thread and waits for it (from any other thread).
  // Runs fn inline when already on the I/O thread or when the loop is not started.
  void run_sync(const std::function<void()>& fn);

  // Runs on the calling thread what is ready now (fd callbacks of one
  // epoll_wait that does not wait, then posted closures), for a loop that was
  // never started: fuzz targets drive a device without any thread this way.
  void run_pending();

  bool on_loop_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Closures posted and not yet run (diagnostics and tests).
  size_t posted_count();

 private:
  void run();
  // One epoll_wait (timeout_ms) and its callbacks; false when the loop must end.
  bool dispatch_ready(int timeout_ms);
  void drain_posted();

  int epfd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::mutex mu_;  // guards callbacks_, posted_, stopping_
  std::unordered_map<int, std::shared_ptr<Callback>> callbacks_;
  std::vector<std::function<void()>> posted_;
  bool stopping_ = false;
  bool started_ = false;
  std::mutex dispatch_mu_;  // held while a callback runs; remove() takes it to wait
  // Read by remove() on other threads while the loop thread writes it.
  std::atomic<std::thread::id> dispatch_thread_{};
};

}  // namespace torpor
