// The I/O thread's loop: posted closures run on it, and every closure posted
// before stop() runs exactly once, even when the loop never started.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>

#include "test/check.h"
#include "base/event_loop.h"

using namespace torpor;

TEST("vmm event loop: closures posted to a loop that never started run at stop (no fd leak)") {
  int fd = eventfd(0, EFD_CLOEXEC);
  CHECK(fd >= 0);
  std::atomic<int> ran{0};
  {
    EventLoop loop;
    CHECK(loop.post([fd, &ran] {
      close(fd);
      ran++;
    }));
    CHECK_EQ(loop.posted_count(), size_t{1});
    loop.stop();
    CHECK_EQ(ran.load(), 1);
    CHECK(!loop.post([&ran] { ran++; }));  // refused after stop
  }
  CHECK_EQ(ran.load(), 1);
  CHECK(fcntl(fd, F_GETFD) < 0);  // closed by the closure
}

TEST("vmm event loop: closures posted before stop run once on a started loop") {
  std::atomic<int> ran{0};
  EventLoop loop;
  loop.start();
  for (int i = 0; i < 100; i++) loop.post([&ran] { ran++; });
  loop.stop();
  CHECK_EQ(ran.load(), 100);
}

TEST("vmm event loop: a closure or fd callback that throws does not end the process; the loop goes on") {
  EventLoop loop;
  loop.start();
  int fd = eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK);  // readable at once
  CHECK(fd >= 0);
  std::atomic<int> fired{0};
  CHECK(loop.add(fd, EPOLLIN, [&fired, &loop, fd](uint32_t) {
    fired++;
    loop.remove(fd);  // from inside its own callback: allowed
    throw std::runtime_error("device bug");
  }));
  loop.post([] { throw std::runtime_error("posted bug"); });
  std::atomic<bool> after{false};
  loop.run_sync([&after] { after = true; });
  for (int i = 0; i < 1000 && fired.load() == 0; i++) usleep(1000);
  loop.run_sync([] {});
  CHECK(after.load());
  CHECK_EQ(fired.load(), 1);
  loop.stop();
  close(fd);
}

TEST("vmm event loop: run_sync carries an exception back to its caller instead of hanging") {
  EventLoop loop;
  loop.start();
  bool threw = false;
  try {
    loop.run_sync([] { throw std::runtime_error("on the loop"); });
  } catch (const std::runtime_error&) {
    threw = true;
  }
  CHECK(threw);
  loop.stop();
}
