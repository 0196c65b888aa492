// The console sink: bounded ring, batched pending bytes, one notification per burst.
#include <string>

#include "common/error.h"
#include "test/check.h"
#include "vmm/console.h"

using torpor::Console;

namespace {
std::string str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
void put(Console& c, const std::string& s) { c.write(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }
}  // namespace

TEST("vmm console: the ring keeps the last bytes, pending batches bursts") {
  int notified = 0;
  Console c(8, "", [&] { notified++; });
  put(c, "hello ");
  put(c, "world");
  CHECK_EQ(notified, 1);  // one notification until the pending bytes are taken
  CHECK(str(c.tail(100)) == "lo world");
  CHECK(str(c.tail(3)) == "rld");
  CHECK(str(c.take_pending()) == "hello world");
  CHECK(c.take_pending().empty());
  put(c, "!");
  CHECK_EQ(notified, 2);
  CHECK_EQ(c.total_bytes(), uint64_t{12});
}

TEST("vmm console: pending output is bounded, the newest bytes kept") {
  Console c(16, "", nullptr);
  std::string big(Console::kPendingMax + 100, 'a');
  big.back() = 'z';
  put(c, big);
  auto p = c.take_pending();
  CHECK_EQ(p.size(), Console::kPendingMax);
  CHECK_EQ(p.back(), 'z');
}

TEST("vmm console: an unwritable log path is an IO_ERROR") {
  CHECK_THROWS_CODE(Console(16, "/nonexistent/dir/console.log", nullptr), "IO_ERROR");
}
