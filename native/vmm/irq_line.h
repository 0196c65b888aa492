// IrqLine implementations over the in-kernel interrupt controllers.
//
// KvmIrqLine drives a GSI: levels through KVM_IRQ_LINE, edges through an
// irqfd when the host has them (one eventfd write, no ioctl; falls back to
// KVM_IRQ_LINE 1 then 0 otherwise).
#pragma once

#include <cstdint>
#include <mutex>

#include "devices/device.h"
#include "base/fd.h"
#include "vmm/kvm.h"

namespace torpor {

class KvmIrqLine final : public IrqLine {
 public:
  KvmIrqLine(KvmVm& vm, uint32_t gsi, bool use_irqfd);
  ~KvmIrqLine() override;
  void set_level(bool high) override;
  void trigger() override;
  uint32_t gsi() const { return gsi_; }

 private:
  KvmVm& vm_;
  uint32_t gsi_;
  Fd irqfd_;
};

}  // namespace torpor
