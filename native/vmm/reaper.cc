#include "vmm/reaper.h"

#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

namespace torpor {

namespace {

// Never destroyed: the thread may still wait on it while the process exits.
struct Reaper {
  std::mutex mu;
  std::condition_variable cv, idle;
  std::deque<std::function<void()>> queue;
  size_t running = 0;
  bool started = false;
  bool failed = false;  // no thread: everything runs inline
};

Reaper& reaper() {
  static Reaper* r = new Reaper();
  return *r;
}

void reaper_main(Reaper* r) {
  pthread_setname_np(pthread_self(), "torpor-reaper");
  std::unique_lock<std::mutex> lock(r->mu);
  for (;;) {
    r->cv.wait(lock, [r] { return !r->queue.empty(); });
    std::function<void()> fn = std::move(r->queue.front());
    r->queue.pop_front();
    r->running++;
    lock.unlock();
    fn();
    fn = nullptr;  // destroy what it captured before saying we are idle
    lock.lock();
    r->running--;
    if (r->queue.empty() && r->running == 0) r->idle.notify_all();
  }
}

}  // namespace

void reap_later(std::function<void()> fn) {
  Reaper& r = reaper();
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (!r.started && !r.failed) {
      try {
        std::thread(reaper_main, &r).detach();
        r.started = true;
      } catch (...) {
        r.failed = true;
      }
    }
    if (r.started && r.queue.size() < kReaperMaxPending) {
      r.queue.push_back(std::move(fn));
      r.cv.notify_one();
      return;
    }
  }
  fn();
}

void reap_drain() {
  Reaper& r = reaper();
  std::unique_lock<std::mutex> lock(r.mu);
  r.idle.wait(lock, [&r] { return r.queue.empty() && r.running == 0; });
}

}  // namespace torpor
