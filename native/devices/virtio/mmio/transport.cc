#include "devices/virtio/mmio/transport.h"

#include <cstring>

namespace torpor {

using namespace virtio_mmio;
namespace vs = virtio;

VirtioMmioTransport::VirtioMmioTransport(GuestMemory& mem, IrqLine& irq, EventLoop& loop,
                                         std::unique_ptr<VirtioDevice> device)
    : mem_(mem), irq_(irq), loop_(loop), device_(std::move(device)), guard_(std::make_shared<Guard>()) {
  if (!device_) throw Error(code::kInvalidArgument, "virtio-mmio: no device");
  name_ = std::string("virtio-mmio-") + device_->name();
  for (uint32_t i = 0; i < device_->num_queues(); i++) {
    uint16_t max = device_->queue_max_size(i);
    if (max == 0 || (max & (max - 1)) || max > vs::kMaxQueueSize)
      throw Error(code::kInternal, name_ + ": queue size must be a power of two up to 32768");
    queues_.push_back(std::make_unique<Virtqueue>(max));
  }
  guard_->notify_posted = std::make_unique<std::atomic<bool>[]>(queues_.size());
  for (size_t i = 0; i < queues_.size(); i++) guard_->notify_posted[i].store(false);
  device_->attach(*this);
}

VirtioMmioTransport::~VirtioMmioTransport() {
  // The device's own callbacks end before the queues and the lock they use.
  device_->detach();
  // A notification posted to the I/O thread may still be queued; it finds
  // alive == false. One running right now finishes before we continue.
  std::lock_guard<std::mutex> g(guard_->mu);
  guard_->alive = false;
}

uint32_t VirtioMmioTransport::num_queues() const { return static_cast<uint32_t>(queues_.size()); }

uint32_t VirtioMmioTransport::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

bool VirtioMmioTransport::active() const {
  return activated_ && !(status_ & (vs::kStatusNeedsReset | vs::kStatusFailed));
}

Virtqueue* VirtioMmioTransport::selected_queue() {
  return queue_sel_ < queues_.size() ? queues_[queue_sel_].get() : nullptr;
}

// ---- registers

void VirtioMmioTransport::read(uint64_t offset, uint8_t* data, size_t len) {
  if (offset == kInterruptStatus && len == 4) {
    uint32_t v = interrupt_status_.load();
    std::memcpy(data, &v, 4);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (offset >= kConfig) {
    device_->read_config(offset - kConfig, data, len);
    return;
  }
  // Registers are 32-bit only (virtio 1.2 §4.2.2.2); anything else reads 0.
  uint32_t v = (len == 4 && offset % 4 == 0) ? read_register(offset) : 0;
  std::memset(data, 0, len);
  std::memcpy(data, &v, std::min<size_t>(len, 4));
}

void VirtioMmioTransport::write(uint64_t offset, const uint8_t* data, size_t len) {
  if (offset < kConfig && (len != 4 || offset % 4)) return;
  uint32_t v = 0;
  if (offset < kConfig) std::memcpy(&v, data, 4);
  if (offset == kInterruptAck) {
    interrupt_status_.fetch_and(~v);
    return;
  }
  if (offset == kQueueNotify) {
    // queues_ never changes size; notify() checks the rest on the I/O thread.
    if (v < queues_.size()) post_notify(v);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (offset >= kConfig) {
    device_->write_config(offset - kConfig, data, len);
    return;
  }
  write_register(offset, v);
}

uint32_t VirtioMmioTransport::read_register(uint64_t offset) {
  Virtqueue* q = selected_queue();
  uint64_t offered = device_->device_features() | vs::kFVersion1;
  switch (offset) {
    case kMagicValue: return kMagic;
    case kVersion: return 2;
    case kDeviceId: return device_->device_type();
    case kVendorId: return kVendor;
    case kDeviceFeatures:
      if (device_features_sel_ == 0) return static_cast<uint32_t>(offered);
      if (device_features_sel_ == 1) return static_cast<uint32_t>(offered >> 32);
      return 0;
    case kQueueNumMax: return q ? q->max_size() : 0;
    case kQueueNum: return q ? q->size() : 0;
    case kQueueReady: return q && q->ready() ? 1 : 0;
    case kQueueDescLow: return q ? static_cast<uint32_t>(q->desc_table()) : 0;
    case kQueueDescHigh: return q ? static_cast<uint32_t>(q->desc_table() >> 32) : 0;
    case kQueueDriverLow: return q ? static_cast<uint32_t>(q->avail_ring()) : 0;
    case kQueueDriverHigh: return q ? static_cast<uint32_t>(q->avail_ring() >> 32) : 0;
    case kQueueDeviceLow: return q ? static_cast<uint32_t>(q->used_ring()) : 0;
    case kQueueDeviceHigh: return q ? static_cast<uint32_t>(q->used_ring() >> 32) : 0;
    case kInterruptStatus: return interrupt_status_.load();
    case kStatus: return status_;
    // No shared memory regions: length all ones means "does not exist".
    case kShmLenLow:
    case kShmLenHigh: return 0xffffffffu;
    case kConfigGeneration: return config_generation_;
    default: return 0;
  }
}

void VirtioMmioTransport::write_register(uint64_t offset, uint32_t v) {
  Virtqueue* q = selected_queue();
  // Queue registers may change only while the queue is not live.
  bool queue_writable = q && !q->ready();
  switch (offset) {
    case kDeviceFeaturesSel: device_features_sel_ = v; break;
    case kDriverFeaturesSel: driver_features_sel_ = v; break;
    case kDriverFeatures:
      if ((status_ & vs::kStatusDriver) && !(status_ & vs::kStatusFeaturesOk)) {
        if (driver_features_sel_ == 0)
          driver_features_ = (driver_features_ & ~uint64_t{0xffffffff}) | v;
        else if (driver_features_sel_ == 1)
          driver_features_ = (driver_features_ & uint64_t{0xffffffff}) | (uint64_t{v} << 32);
      }
      break;
    case kQueueSel: queue_sel_ = v; break;
    case kQueueNum:
      // An out-of-range size is kept as 0 so that validate() refuses it.
      if (queue_writable) q->set_size(v <= vs::kMaxQueueSize ? static_cast<uint16_t>(v) : 0);
      break;
    case kQueueDescLow: if (queue_writable) q->set_desc_table((q->desc_table() & ~uint64_t{0xffffffff}) | v); break;
    case kQueueDescHigh: if (queue_writable) q->set_desc_table((q->desc_table() & 0xffffffff) | (uint64_t{v} << 32)); break;
    case kQueueDriverLow: if (queue_writable) q->set_avail_ring((q->avail_ring() & ~uint64_t{0xffffffff}) | v); break;
    case kQueueDriverHigh: if (queue_writable) q->set_avail_ring((q->avail_ring() & 0xffffffff) | (uint64_t{v} << 32)); break;
    case kQueueDeviceLow: if (queue_writable) q->set_used_ring((q->used_ring() & ~uint64_t{0xffffffff}) | v); break;
    case kQueueDeviceHigh: if (queue_writable) q->set_used_ring((q->used_ring() & 0xffffffff) | (uint64_t{v} << 32)); break;
    case kQueueReady:
      if (!q) break;
      if (v == 1 && !q->ready()) {
        q->set_features(driver_features_ & vs::kFRingEventIdx, driver_features_ & vs::kFRingIndirectDesc);
        if (const char* why = q->validate(mem_)) {
          fail(why);
          break;
        }
        q->set_ready(true);
        // A queue enabled after DRIVER_OK may already hold buffers.
        if (active()) post_notify(queue_sel_);
      } else if (v == 0) {
        q->set_ready(false);
      }
      break;
    case kStatus: write_status(v); break;
    default: break;  // read-only or unknown: ignored
  }
}

void VirtioMmioTransport::write_status(uint32_t v) {
  if (v == 0) {
    reset_locked();
    return;
  }
  uint32_t old = status_;
  // The driver only ever adds bits; bits the device owns stay as they are.
  uint32_t next = v | (old & vs::kStatusNeedsReset);
  if ((next & vs::kStatusFeaturesOk) && !(old & vs::kStatusFeaturesOk)) {
    uint64_t offered = device_->device_features() | vs::kFVersion1;
    bool ok = (driver_features_ & ~offered) == 0 && (driver_features_ & vs::kFVersion1);
    // Leaving FEATURES_OK clear tells the driver we refused its subset.
    if (!ok) next &= ~vs::kStatusFeaturesOk;
  }
  status_ = next;
  if ((next & vs::kStatusDriverOk) && !(old & vs::kStatusDriverOk) && !activated_) {
    if (!(next & vs::kStatusFeaturesOk)) {
      fail("DRIVER_OK without FEATURES_OK");
      return;
    }
    for (auto& q : queues_) {
      q->set_features(driver_features_ & vs::kFRingEventIdx, driver_features_ & vs::kFRingIndirectDesc);
      if (!q->ready()) continue;
      if (const char* why = q->validate(mem_)) {
        fail(why);
        return;
      }
    }
    if (status_ & (vs::kStatusNeedsReset | vs::kStatusFailed)) return;
    activated_ = true;
    try {
      device_->activate();
    } catch (const std::exception& e) {
      fail("device error on DRIVER_OK");
      last_error_ = e.what();
    }
  }
}

void VirtioMmioTransport::reset_locked() {
  device_->reset();
  for (auto& q : queues_) q->reset();
  status_ = 0;
  device_features_sel_ = 0;
  driver_features_sel_ = 0;
  driver_features_ = 0;
  queue_sel_ = 0;
  interrupt_status_.store(0);
  activated_ = false;
}

// ---- interrupts and notifications

void VirtioMmioTransport::raise(uint32_t bits) {
  interrupt_status_.fetch_or(bits);
  irq_.trigger();
}

void VirtioMmioTransport::signal_used(uint32_t queue) {
  if (!active() || queue >= queues_.size()) return;
  if (queues_[queue]->needs_interrupt(mem_)) raise(vs::kInterruptUsedBuffer);
}

void VirtioMmioTransport::signal_config_change() {
  config_generation_++;
  raise(vs::kInterruptConfigChange);
}

void VirtioMmioTransport::fail(const char* why) {
  last_error_ = why;
  if (status_ & vs::kStatusNeedsReset) return;
  status_ |= vs::kStatusNeedsReset;
  if (status_ & vs::kStatusDriverOk) raise(vs::kInterruptConfigChange);
}

void VirtioMmioTransport::post_notify(uint32_t queue) {
  std::shared_ptr<Guard> guard = guard_;
  // One already queued serves this kick too: notify() looks at the whole ring.
  if (guard->notify_posted[queue].exchange(true)) return;
  bool posted = loop_.post([guard, this, queue] {
    // Cleared before serving: a kick from now on queues a new notification.
    guard->notify_posted[queue].store(false);
    std::lock_guard<std::mutex> g(guard->mu);
    if (guard->alive) notify(queue);
  });
  if (!posted) guard->notify_posted[queue].store(false);
}

void VirtioMmioTransport::notify(uint32_t queue) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue >= queues_.size()) return;
  if (quiesced_) {
    held_notifies_ |= uint64_t{1} << (queue % 64);
    return;
  }
  if (!active() || !queues_[queue]->ready()) return;
  // This runs on the I/O thread, where an escaping exception would end the
  // process: a device that throws is failed instead (DEVICE_NEEDS_RESET).
  try {
    device_->queue_notify(queue);
  } catch (const std::exception& e) {
    fail("device error while serving a queue");
    last_error_ = e.what();
  }
}

void VirtioMmioTransport::quiesce() {
  std::lock_guard<std::mutex> lock(mu_);
  if (quiesced_) return;
  quiesced_ = true;
  device_->quiesce();
}

void VirtioMmioTransport::unquiesce() {
  uint64_t held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!quiesced_) return;
    quiesced_ = false;
    held = held_notifies_;
    held_notifies_ = 0;
    device_->unquiesce();
  }
  for (uint32_t q = 0; q < queues_.size(); q++)
    if (held & (uint64_t{1} << (q % 64))) post_notify(q);
}

bool VirtioMmioTransport::quiesced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return quiesced_;
}

// ---- snapshot

void VirtioMmioTransport::save(StateWriter& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  out.header("virtio-mmio", 1);
  out.u32(device_->device_type());
  out.u32(static_cast<uint32_t>(queues_.size()));
  out.u32(status_);
  out.u32(device_features_sel_);
  out.u32(driver_features_sel_);
  out.u64(driver_features_);
  out.u32(queue_sel_);
  out.u32(interrupt_status_.load());
  out.u32(config_generation_);
  out.boolean(activated_);
  out.str(last_error_);
  for (const auto& q : queues_) q->save(out);
  device_->save(out);
}

void VirtioMmioTransport::restore(StateReader& in) {
  std::lock_guard<std::mutex> lock(mu_);
  in.expect_header("virtio-mmio", 1, 1);
  if (in.u32() != device_->device_type()) StateReader::fail(name_ + ": state is for another device type");
  if (in.u32() != queues_.size()) StateReader::fail(name_ + ": state has another number of queues");
  reset_locked();
  try {
    status_ = in.u32();
    device_features_sel_ = in.u32();
    driver_features_sel_ = in.u32();
    driver_features_ = in.u64();
    queue_sel_ = in.u32();
    interrupt_status_.store(in.u32());
    config_generation_ = in.u32();
    bool activated = in.boolean();
    last_error_ = in.str(256);
    uint64_t offered = device_->device_features() | vs::kFVersion1;
    if (driver_features_ & ~offered) StateReader::fail(name_ + ": saved features were never offered");
    for (auto& q : queues_) {
      q->restore(in);
      // The file is untrusted like the guest: a live queue must sit in this
      // machine's RAM, aligned, as the QueueReady write checked it.
      if (q->ready())
        if (const char* why = q->validate(mem_)) StateReader::fail(name_ + ": restored queue: " + why);
    }
    device_->restore(in);
    activated_ = activated;
    if (activated_) device_->activate();
    // The device's config changed since the capture (a disk grown on restore):
    // a driver that already read it learns it as it would at run time. The
    // trigger below raises the line. A driver not yet live reads it at probe.
    if (device_->restored_config_changed() && (status_ & vs::kStatusDriverOk)) {
      config_generation_++;
      interrupt_status_.fetch_or(vs::kInterruptConfigChange);
    }
  } catch (...) {
    // Leave a device the guest can reset and set up again.
    reset_locked();
    throw;
  }
  // The interrupt edge may have been captured before the guest saw it.
  if (interrupt_status_.load()) irq_.trigger();
  // A kick posted to the I/O thread but not served before the capture was
  // lost with it; look at every live queue once.
  if (active())
    for (uint32_t i = 0; i < queues_.size(); i++)
      if (queues_[i]->ready()) post_notify(i);
}

}  // namespace torpor
