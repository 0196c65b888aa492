// virtio-net device + stream backend throughput on this host, outside any VM: frames through
// the real transport and virtqueues over fake guest memory, the StreamBackend on a socketpair
// whose other end a thread drains (tx) or fills (rx) as passt would. This is the part of the
// network path torpor owns; the guest's driver and passt's stack come on top of it.
// Release build (-O2, no sanitizers):  make -C native/bench net
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "devices/virtio/mmio/test_driver.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/net/make_net.h"
#include "devices/virtio/net/net_device.h"
#include "devices/virtio/net/stream_frame.h"

using namespace torpor;
using namespace torpor::testing;
using namespace torpor::virtio_net;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint16_t kRing = 256;
constexpr uint64_t kRxRing = 0x10000, kTxRing = 0x30000, kBufs = 0x100000;
constexpr uint64_t kRam = 64ull << 20;
const MacAddress kMac = {0x52, 0x54, 0, 1, 2, 3};

struct Rig {
  FakeRam ram{kRam};
  CountingIrq irq;
  EventLoop loop;
  MockDriverQueue rxq{ram.mem, kRxRing, kRing}, txq{ram.mem, kTxRing, kRing};
  std::unique_ptr<VirtioMmioTransport> dev;
  int peer = -1;
  Rig() {
    loop.start();
    dev = std::make_unique<VirtioMmioTransport>(ram.mem, irq, loop, std::make_unique<VirtioNetDevice>(ram.mem, kMac));
    init_device(*dev, {&rxq, &txq});
    Fd theirs = virtio_net_attach_pair(*dev);
    peer = theirs.release();
  }
  ~Rig() {
    dev.reset();
    loop.stop();
    ::close(peer);
  }
};

double tx_gbps(size_t frame, double seconds) {
  Rig r;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> got{0};
  std::thread drain([&] {
    std::vector<uint8_t> buf(1 << 20);
    while (!stop) {
      ssize_t n = ::read(r.peer, buf.data(), buf.size());
      if (n > 0) got += static_cast<uint64_t>(n);
      else break;
    }
  });
  // One buffer per ring slot, header + frame, written once.
  for (uint16_t i = 0; i < kRing; i++) {
    uint64_t at = kBufs + uint64_t{i} * 0x10000;
    std::memset(r.ram.at(at), 0, kHeaderLen + frame);
    r.ram.at(at + kHeaderLen)[12] = 0x88;  // an experimental ethertype: a payload, not a protocol
  }
  uint16_t sent = 0, seen = 0;
  auto t0 = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds) {
    {
      std::lock_guard<std::mutex> lock(r.dev->lock());
      seen = r.txq.used_idx();
      while (static_cast<uint16_t>(sent - seen) < kRing) {
        uint16_t slot = sent % kRing;
        r.txq.add_chain({{kBufs + uint64_t{slot} * 0x10000, static_cast<uint32_t>(kHeaderLen + frame), false}});
        sent++;
      }
    }
    r.dev->notify(1);
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  ::shutdown(r.peer, SHUT_RDWR);
  drain.join();
  return static_cast<double>(got.load()) * 8 / secs / 1e9;
}

double rx_gbps(size_t frame, double seconds) {
  Rig r;
  std::atomic<bool> stop{false};
  std::thread fill([&] {
    std::vector<uint8_t> batch;
    for (int i = 0; i < 64; i++) {
      size_t at = batch.size();
      batch.resize(at + 4 + frame);
      net_stream::put_length(batch.data() + at, static_cast<uint32_t>(frame));
      batch[at + 4 + 12] = 0x88;
    }
    while (!stop) {
      size_t off = 0;
      while (off < batch.size() && !stop) {
        ssize_t n = ::write(r.peer, batch.data() + off, batch.size() - off);
        if (n <= 0) return;
        off += static_cast<size_t>(n);
      }
    }
  });
  uint32_t buf_len = static_cast<uint32_t>(kHeaderLen + frame);
  uint16_t posted = 0, seen = 0;
  uint64_t bytes = 0;
  auto t0 = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds) {
    {
      std::lock_guard<std::mutex> lock(r.dev->lock());
      uint16_t used = r.rxq.used_idx();
      while (seen != used) {
        bytes += r.rxq.used(seen).len - kHeaderLen;
        seen++;
      }
      while (static_cast<uint16_t>(posted - seen) < kRing) {
        r.rxq.add_chain({{kBufs + static_cast<uint64_t>(posted % kRing) * 0x10000, buf_len, true}});
        posted++;
      }
    }
    r.dev->notify(0);
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  stop = true;
  ::shutdown(r.peer, SHUT_RDWR);
  fill.join();
  return static_cast<double>(bytes) * 8 / secs / 1e9;
}

}  // namespace

int main() {
  std::printf("virtio-net device + stream backend over a socketpair (fake guest memory, one peer thread)\n");
  for (size_t frame : {size_t{1514}, size_t{9014}, size_t{65000}}) {
    double tx = tx_gbps(frame, 1.0), rx = rx_gbps(frame, 1.0);
    std::printf("frame %6zu B: guest->backend %6.2f Gbit/s   backend->guest %6.2f Gbit/s\n", frame, tx, rx);
  }
  return 0;
}
