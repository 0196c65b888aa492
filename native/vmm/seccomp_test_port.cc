#include "vmm/seccomp_test_port.h"

#include <cstdlib>
#include <cstring>

#include "vmm/thread_seccomp.h"

namespace torpor {

bool SeccompTestPort::wanted() { return std::getenv("TORPOR_SECCOMP_TEST_HOOK") != nullptr; }

void SeccompTestPort::read(uint64_t, uint8_t* data, size_t len) { std::memset(data, 0xff, len); }

void SeccompTestPort::write(uint64_t, const uint8_t* data, size_t len) {
  if (len < 1) return;
  if (data[0] == 1) seccomp_make_forbidden_call();
  if (data[0] == 2) loop_.post([] { seccomp_make_forbidden_call(); });
}

}  // namespace torpor
