// The I/O thread's loop: posted closures run on it, and every closure posted
// before stop() runs exactly once, even when the loop never started.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>

#include "test/check.h"
#include "vmm/event_loop.h"

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
