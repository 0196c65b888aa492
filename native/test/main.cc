#include <cstring>
#include <exception>

#include "common/error.h"
#include "test/check.h"

namespace torpor_test {
std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}
}  // namespace torpor_test

// Usage: unit_tests [substring]  (runs the tests whose name contains it)
int main(int argc, char** argv) {
  int passed = 0, failed = 0;
  for (auto& c : torpor_test::registry()) {
    if (argc > 1 && !std::strstr(c.name, argv[1])) continue;
    try {
      c.fn();
      passed++;
    } catch (const torpor_test::Failure& f) {
      failed++;
      std::printf("FAIL %s\n  %s\n", c.name, f.what.c_str());
    } catch (const torpor::Error& e) {
      failed++;
      std::printf("FAIL %s\n  uncaught torpor::Error %s: %s\n", c.name, e.code(), e.what());
    } catch (const std::exception& e) {
      failed++;
      std::printf("FAIL %s\n  uncaught exception: %s\n", c.name, e.what());
    }
  }
  std::printf("native: %d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
