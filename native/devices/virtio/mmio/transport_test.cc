// The virtio-mmio register protocol, driven the way a guest driver drives it,
// with the rng device behind the transport and a mock driver queue.
#include <chrono>
#include <cstring>
#include <thread>

#include "devices/virtio/mmio/test_driver.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/rng/rng_device.h"
#include "test/check.h"

using namespace torpor;
using namespace torpor::testing;
using namespace torpor::virtio_mmio;

namespace {

constexpr uint64_t kRings = 0x10000;
constexpr uint64_t kBuf = 0x40000;

struct Rig {
  FakeRam ram{1 << 20};
  CountingIrq irq;
  EventLoop loop;
  MockDriverQueue driver{ram.mem, kRings, 16};
  std::unique_ptr<VirtioMmioTransport> dev;
  Rig() { dev = std::make_unique<VirtioMmioTransport>(ram.mem, irq, loop, std::make_unique<VirtioRngDevice>(ram.mem)); }
  uint32_t status() { return reg_read(*dev, kStatus); }
  uint32_t init(uint64_t wanted = ~uint64_t{0}) { return init_device(*dev, {&driver}, wanted); }
};

constexpr uint32_t kOkStatus = virtio::kStatusAcknowledge | virtio::kStatusDriver | virtio::kStatusFeaturesOk |
                               virtio::kStatusDriverOk;

// Polls the device's own count of used entries under its lock (reading the
// used ring while the I/O thread writes it would be a race in C++ terms).
bool wait_used(VirtioMmioTransport& dev, uint16_t n) {
  for (int i = 0; i < 2000; i++) {
    {
      std::lock_guard<std::mutex> lock(dev.lock());
      if (dev.queue(0).next_used() == n) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

}  // namespace

TEST("virtio-mmio: identity registers") {
  Rig r;
  CHECK_EQ(reg_read(*r.dev, kMagicValue), 0x74726976u);
  CHECK_EQ(reg_read(*r.dev, kVersion), 2u);
  CHECK_EQ(reg_read(*r.dev, kDeviceId), virtio::kDeviceEntropy);
  CHECK_EQ(reg_read(*r.dev, kVendorId), kVendor);
  uint64_t f = read_device_features(*r.dev);
  CHECK(f & virtio::kFVersion1);
  CHECK(f & virtio::kFRingEventIdx);
  CHECK(f & virtio::kFRingIndirectDesc);
  reg_write(*r.dev, kQueueSel, 0);
  CHECK_EQ(reg_read(*r.dev, kQueueNumMax), 64u);
  reg_write(*r.dev, kQueueSel, 1);  // no such queue
  CHECK_EQ(reg_read(*r.dev, kQueueNumMax), 0u);
  CHECK_EQ(reg_read(*r.dev, kShmLenLow), 0xffffffffu);
  // Registers are 32-bit only: a 2-byte read gives 0.
  uint16_t half = 0xffff;
  r.dev->read(kMagicValue, reinterpret_cast<uint8_t*>(&half), 2);
  CHECK_EQ(half, uint16_t{0});
  CHECK_EQ(r.dev->num_queues(), 1u);
}

TEST("virtio-mmio: feature negotiation refuses a driver without VERSION_1 or with unoffered bits") {
  Rig r;
  CHECK_EQ(r.init(~virtio::kFVersion1) & virtio::kStatusFeaturesOk, 0u);
  {
    Rig s;
    reg_write(*s.dev, kStatus, virtio::kStatusAcknowledge | virtio::kStatusDriver);
    write_driver_features(*s.dev, virtio::kFVersion1 | (uint64_t{1} << 40));
    reg_write(*s.dev, kStatus, virtio::kStatusAcknowledge | virtio::kStatusDriver | virtio::kStatusFeaturesOk);
    CHECK_EQ(s.status() & virtio::kStatusFeaturesOk, 0u);
  }
  Rig ok;
  CHECK_EQ(ok.init(virtio::kFVersion1), kOkStatus);
  CHECK_EQ(ok.dev->driver_features(), virtio::kFVersion1);
  // Features are frozen once FEATURES_OK is set.
  write_driver_features(*ok.dev, virtio::kFVersion1 | virtio::kFRingEventIdx);
  CHECK_EQ(ok.dev->driver_features(), virtio::kFVersion1);
}

TEST("virtio-mmio: queue setup, DRIVER_OK, used buffers raise InterruptStatus bit 0, ACK clears it") {
  Rig r;
  CHECK_EQ(r.init(), kOkStatus);
  Virtqueue& q = r.dev->queue(0);
  CHECK(q.ready());
  CHECK_EQ(q.size(), uint16_t{16});
  CHECK_EQ(q.desc_table(), r.driver.desc_table());
  CHECK_EQ(q.avail_ring(), r.driver.avail_ring());
  CHECK_EQ(q.used_ring(), r.driver.used_ring());
  CHECK(q.event_idx());
  // Queue addresses cannot change while the queue is live.
  reg_write(*r.dev, kQueueDescLow, 0x5000);
  CHECK_EQ(q.desc_table(), r.driver.desc_table());
  r.driver.add_chain({{kBuf, 32, true}});
  r.dev->notify(0);
  CHECK_EQ(r.driver.used_idx(), uint16_t{1});
  CHECK_EQ(r.driver.used(0).len, 32u);
  CHECK_EQ(r.irq.count.load(), 1);
  CHECK_EQ(reg_read(*r.dev, kInterruptStatus), virtio::kInterruptUsedBuffer);
  reg_write(*r.dev, kInterruptAck, virtio::kInterruptUsedBuffer);
  CHECK_EQ(reg_read(*r.dev, kInterruptStatus), 0u);
}

TEST("virtio-mmio: EVENT_IDX used_event suppresses the interrupt line") {
  Rig r;
  CHECK_EQ(r.init(), kOkStatus);
  r.driver.add_chain({{kBuf, 8, true}});
  r.dev->notify(0);
  CHECK_EQ(r.irq.count.load(), 1);
  r.driver.set_used_event(5);  // "interrupt me when used idx passes 5"
  r.driver.add_chain({{kBuf, 8, true}});
  r.dev->notify(0);
  CHECK_EQ(r.driver.used_idx(), uint16_t{2});
  CHECK_EQ(r.irq.count.load(), 1);
}

TEST("virtio-mmio: a QueueNotify write is served on the I/O thread") {
  Rig r;
  r.loop.start();
  CHECK_EQ(r.init(), kOkStatus);
  r.driver.add_chain({{kBuf, 16, true}});
  reg_write(*r.dev, kQueueNotify, 0);
  CHECK(wait_used(*r.dev, 1));
  reg_write(*r.dev, kQueueNotify, 7);  // no such queue: ignored
  r.loop.stop();
}

TEST("virtio-mmio: a guest hammering QueueNotify queues one notification, and none is lost") {
  Rig r;
  CHECK_EQ(r.init(), kOkStatus);
  r.driver.add_chain({{kBuf, 16, true}});
  for (int i = 0; i < 100000; i++) reg_write(*r.dev, kQueueNotify, 0);
  CHECK_EQ(r.loop.posted_count(), size_t{1});  // not 100000 closures
  r.loop.start();
  CHECK(wait_used(*r.dev, 1));
  // Served: the next kick queues again and is served too.
  r.driver.add_chain({{kBuf + 64, 16, true}});
  reg_write(*r.dev, kQueueNotify, 0);
  CHECK(wait_used(*r.dev, 2));
  r.loop.stop();
}

TEST("virtio-mmio: writing 0 to Status resets device and queues") {
  Rig r;
  CHECK_EQ(r.init(), kOkStatus);
  r.driver.add_chain({{kBuf, 8, true}});
  r.dev->notify(0);
  reg_write(*r.dev, kStatus, 0);
  CHECK_EQ(r.status(), 0u);
  CHECK(!r.dev->queue(0).ready());
  CHECK_EQ(reg_read(*r.dev, kQueueReady), 0u);
  CHECK_EQ(reg_read(*r.dev, kInterruptStatus), 0u);
  CHECK_EQ(r.dev->driver_features(), uint64_t{0});
  CHECK_EQ(r.dev->queue(0).next_avail(), uint16_t{0});
  // A notify after reset does nothing.
  r.dev->notify(0);
  CHECK_EQ(r.driver.used_idx(), uint16_t{1});
}

TEST("virtio-mmio: a bad queue or a malformed chain sets DEVICE_NEEDS_RESET, never crashes") {
  {
    Rig r;
    MockDriverQueue bad(r.ram.mem, 0xff000, 16);  // rings run past the end of RAM
    CHECK(init_device(*r.dev, {&bad}) & virtio::kStatusNeedsReset);
    CHECK(!r.dev->active());
    CHECK(!r.dev->last_error().empty());
  }
  {
    Rig r;
    reg_write(*r.dev, kStatus, virtio::kStatusAcknowledge | virtio::kStatusDriver);
    write_driver_features(*r.dev, read_device_features(*r.dev));
    reg_write(*r.dev, kStatus, virtio::kStatusAcknowledge | virtio::kStatusDriver | virtio::kStatusFeaturesOk);
    reg_write(*r.dev, kQueueSel, 0);
    reg_write(*r.dev, kQueueNum, 12);  // not a power of two
    reg_write(*r.dev, kQueueReady, 1);
    CHECK(r.status() & virtio::kStatusNeedsReset);
    CHECK_EQ(reg_read(*r.dev, kQueueReady), 0u);
  }
  Rig r;
  CHECK_EQ(r.init(), kOkStatus);
  int before = r.irq.count.load();
  r.driver.write_desc(0, {kBuf, 8, virtio::kDescFNext | virtio::kDescFWrite, 0});  // loop
  r.driver.publish(0);
  r.dev->notify(0);
  CHECK(r.status() & virtio::kStatusNeedsReset);
  CHECK(reg_read(*r.dev, kInterruptStatus) & virtio::kInterruptConfigChange);
  CHECK_EQ(r.irq.count.load(), before + 1);
  CHECK(std::strstr(r.dev->last_error().c_str(), "longer than the queue"));
  // The driver resets and sets the device up again: it works.
  MockDriverQueue fresh(r.ram.mem, 0x20000, 16);
  CHECK_EQ(init_device(*r.dev, {&fresh}), kOkStatus);
  fresh.add_chain({{kBuf, 8, true}});
  r.dev->notify(0);
  CHECK_EQ(fresh.used_idx(), uint16_t{1});
}

TEST("virtio-mmio: config change bumps ConfigGeneration and raises bit 1") {
  Rig r;
  CHECK_EQ(r.init(), kOkStatus);
  uint32_t gen = reg_read(*r.dev, kConfigGeneration);
  {
    std::lock_guard<std::mutex> lock(r.dev->lock());
    r.dev->signal_config_change();
  }
  CHECK_EQ(reg_read(*r.dev, kConfigGeneration), gen + 1);
  CHECK(reg_read(*r.dev, kInterruptStatus) & virtio::kInterruptConfigChange);
}

namespace {
// A device whose config space grew since it was saved (as virtio-blk over a grown disk).
class GrownDevice final : public VirtioDevice {
 public:
  explicit GrownDevice(bool grown) : grown_(grown) {}
  const char* name() const override { return "grown"; }
  uint32_t device_type() const override { return virtio::kDeviceEntropy; }
  uint64_t device_features() const override { return virtio::kFRingFeatures; }
  uint32_t num_queues() const override { return 1; }
  uint16_t queue_max_size(uint32_t) const override { return 64; }
  void read_config(uint64_t, uint8_t* data, size_t len) override { std::memset(data, 0, len); }
  void write_config(uint64_t, const uint8_t*, size_t) override {}
  void attach(VirtioTransport&) override {}
  void activate() override {}
  void queue_notify(uint32_t) override {}
  void reset() override {}
  void save(StateWriter&) const override {}
  void restore(StateReader&) override {}
  bool restored_config_changed() const override { return grown_; }

 private:
  bool grown_;
};
}  // namespace

TEST("virtio-mmio: a device changed since its save gets a config change on restore, only with a live driver") {
  Rig a;
  CHECK_EQ(a.init(), kOkStatus);
  const uint32_t gen = reg_read(*a.dev, kConfigGeneration);
  StateWriter w;
  a.dev->save(w);
  auto saved = w.data();
  // The rng's own state is empty too (nothing after the transport's fields), so GrownDevice reads it.
  for (bool grown : {false, true}) {
    CountingIrq irq;
    EventLoop loop;
    VirtioMmioTransport t(a.ram.mem, irq, loop, std::make_unique<GrownDevice>(grown));
    StateReader in(saved);
    t.restore(in);
    CHECK_EQ(reg_read(t, kConfigGeneration), grown ? gen + 1 : gen);
    CHECK_EQ((reg_read(t, kInterruptStatus) & virtio::kInterruptConfigChange) != 0, grown);
    CHECK_EQ(irq.count.load() > 0, grown);  // nothing else was pending in the capture
  }
  // Saved before the driver set DRIVER_OK: it reads the config at probe, no interrupt.
  Rig fresh;
  StateWriter w2;
  fresh.dev->save(w2);
  CountingIrq irq;
  EventLoop loop;
  VirtioMmioTransport t(fresh.ram.mem, irq, loop, std::make_unique<GrownDevice>(true));
  StateReader in(w2.data());
  t.restore(in);
  CHECK_EQ(reg_read(t, kInterruptStatus), 0u);
  CHECK_EQ(irq.count.load(), 0);
}

TEST("virtio-mmio: save/restore carries registers and queues to a new transport") {
  Rig a;
  CHECK_EQ(a.init(), kOkStatus);
  a.driver.add_chain({{kBuf, 8, true}});
  a.dev->notify(0);
  StateWriter w;
  a.dev->save(w);

  // Same guest memory, a fresh transport (as after a restore into a new process).
  CountingIrq irq;
  EventLoop loop;
  VirtioMmioTransport b(a.ram.mem, irq, loop, std::make_unique<VirtioRngDevice>(a.ram.mem));
  StateReader in(w.data());
  b.restore(in);
  in.expect_end();
  CHECK_EQ(reg_read(b, kStatus), kOkStatus);
  CHECK(b.active());
  CHECK_EQ(b.queue(0).next_used(), uint16_t{1});
  CHECK_EQ(irq.count.load(), 1);  // the pending InterruptStatus is re-raised
  a.driver.add_chain({{kBuf, 8, true}});
  b.notify(0);
  CHECK_EQ(a.driver.used_idx(), uint16_t{2});

  // The restore posted one notification per live queue, for kicks lost in the capture.
  a.driver.add_chain({{kBuf, 8, true}});
  loop.start();
  CHECK(wait_used(b, 3));  // posted before start, served now
  loop.stop();

  // Malformed or foreign state is refused and leaves a reset, usable device.
  auto bytes = w.data();
  bytes.resize(bytes.size() / 2);
  StateReader cut(bytes);
  CHECK_THROWS_CODE(b.restore(cut), "SNAPSHOT_INVALID");
  CHECK_EQ(reg_read(b, kStatus), 0u);
  StateWriter other;
  other.header("virtio-mmio", 1);
  other.u32(virtio::kDeviceBlock);
  StateReader foreign(other.data());
  CHECK_THROWS_CODE(b.restore(foreign), "SNAPSHOT_INVALID");

  // A live queue whose rings are not in this machine's RAM is refused too.
  FakeRam small(0x8000);  // the rings sit at 0x10000
  EventLoop loop2;
  VirtioMmioTransport c(small.mem, irq, loop2, std::make_unique<VirtioRngDevice>(small.mem));
  StateReader elsewhere(w.data());
  CHECK_THROWS_CODE(c.restore(elsewhere), "SNAPSHOT_INVALID");
  CHECK_EQ(reg_read(c, kStatus), 0u);
}

TEST("virtio-mmio: a notification posted before destruction is dropped safely") {
  FakeRam ram(1 << 20);
  CountingIrq irq;
  EventLoop loop;
  MockDriverQueue driver(ram.mem, kRings, 16);
  {
    VirtioMmioTransport dev(ram.mem, irq, loop, std::make_unique<VirtioRngDevice>(ram.mem));
    CHECK_EQ(init_device(dev, {&driver}), kOkStatus);
    driver.add_chain({{kBuf, 8, true}});
    reg_write(dev, kQueueNotify, 0);  // posted; the loop is not running yet
  }
  loop.start();
  loop.run_sync([] {});  // the posted closure ran and found the transport gone
  loop.stop();
  CHECK_EQ(driver.used_idx(), uint16_t{0});
}

TEST("virtio-mmio: vCPU threads hammering registers while the I/O thread serves the queue") {
  Rig r;
  CHECK_EQ(r.init(), kOkStatus);
  const uint16_t n = 16;
  for (uint16_t i = 0; i < n; i++) r.driver.add_chain({{kBuf + 64u * i, 64, true}});
  r.loop.start();
  std::atomic<bool> done{false};
  std::thread kicker([&] {
    while (!done) {
      reg_write(*r.dev, kQueueNotify, 0);
      uint32_t isr = reg_read(*r.dev, kInterruptStatus);
      if (isr) reg_write(*r.dev, kInterruptAck, isr);
    }
  });
  std::thread reader([&] {
    while (!done) {
      uint32_t cfg = 0;
      r.dev->read(kConfig, reinterpret_cast<uint8_t*>(&cfg), 4);
      CHECK_EQ(reg_read(*r.dev, kStatus), kOkStatus);
      CHECK_EQ(reg_read(*r.dev, kQueueNumMax), 64u);
    }
  });
  bool served = wait_used(*r.dev, n);
  done = true;
  kicker.join();
  reader.join();
  r.loop.stop();
  CHECK(served);
  CHECK_EQ(r.driver.used_idx(), n);
}
