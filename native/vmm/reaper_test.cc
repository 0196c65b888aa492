// The reaper: work runs off the caller's thread, in order, and a full queue
// makes the caller do its own work (back-pressure, so nothing piles up).
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "test/check.h"
#include "vmm/reaper.h"

using namespace torpor;

TEST("vmm reaper: runs off the caller's thread, in order; drain waits for it") {
  std::mutex mu;
  std::vector<int> order;
  std::atomic<int> off_thread{0};
  auto caller = std::this_thread::get_id();
  for (int i = 0; i < 3; i++)
    reap_later([&, i] {
      if (std::this_thread::get_id() != caller) off_thread++;
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
  reap_drain();
  CHECK_EQ(order.size(), size_t{3});
  CHECK_EQ(order[0], 0);
  CHECK_EQ(order[2], 2);
  CHECK(off_thread.load() >= 1);
}

TEST("vmm reaper: with the queue full the caller runs its own work inline") {
  std::atomic<bool> release{false};
  // One closure blocks the thread; kReaperMaxPending more fill the queue.
  reap_later([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the thread take it
  for (size_t i = 0; i < kReaperMaxPending; i++) reap_later([] {});
  auto caller = std::this_thread::get_id();
  std::thread::id ran_on;
  reap_later([&] { ran_on = std::this_thread::get_id(); });
  CHECK(ran_on == caller);  // ran before reap_later returned
  release.store(true);
  reap_drain();
}
