// What every emulated device is to the machine.
//
// A device sees offsets inside its own range, never absolute addresses: the
// Bus owns base addresses. Device logic does no I/O of its own; whatever it
// needs from the outside (an interrupt line, an output sink, a disk backend,
// guest memory) is handed to it, so every device is unit-tested without KVM.
//
// save()/restore() are pure virtual on purpose: a device that forgot them
// would silently lose state in a snapshot. restore() throws
// Error(SNAPSHOT_INVALID) on a malformed blob and leaves the device usable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/state_io.h"

namespace torpor {

// An interrupt line into the guest (a GSI of the in-kernel IOAPIC/PIC).
// Implemented by the machine with KVM_IRQ_LINE or an irqfd; by tests with a
// recorder.
class IrqLine {
 public:
  virtual ~IrqLine() = default;
  virtual void set_level(bool high) = 0;
  // Edge: raise and lower (what virtio-mmio and the 8250 with an edge-
  // triggered IOAPIC entry need).
  virtual void trigger() = 0;
};

class BusDevice {
 public:
  virtual ~BusDevice() = default;
  virtual const char* name() const = 0;
  // len is 1, 2, 4 or 8; offset is relative to the device's base.
  virtual void read(uint64_t offset, uint8_t* data, size_t len) = 0;
  virtual void write(uint64_t offset, const uint8_t* data, size_t len) = 0;
  virtual void save(StateWriter& out) const = 0;
  virtual void restore(StateReader& in) = 0;
};

}  // namespace torpor
