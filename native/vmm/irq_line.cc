#include "vmm/irq_line.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include "common/error.h"

namespace torpor {

KvmIrqLine::KvmIrqLine(KvmVm& vm, uint32_t gsi, bool use_irqfd) : vm_(vm), gsi_(gsi) {
  if (!use_irqfd) return;
  Fd fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!fd.valid()) throw_sys_error(code::kInternal, "eventfd (irqfd)");
  vm_.irqfd(fd.get(), gsi_);
  irqfd_ = std::move(fd);
}

KvmIrqLine::~KvmIrqLine() {
  if (irqfd_.valid()) vm_.irqfd_remove(irqfd_.get(), gsi_);
}

void KvmIrqLine::set_level(bool high) { vm_.irq_line(gsi_, high); }

void KvmIrqLine::trigger() {
  if (irqfd_.valid()) {
    uint64_t one = 1;
    // EAGAIN means the counter is saturated: an interrupt is pending anyway.
    ssize_t n = ::write(irqfd_.get(), &one, sizeof(one));
    (void)n;
    return;
  }
  vm_.irq_line(gsi_, true);
  vm_.irq_line(gsi_, false);
}

}  // namespace torpor
