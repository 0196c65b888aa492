// Fuzz target: the virtio-net device fed by a guest the fuzzer controls (tx chains of any
// layout and length, rx buffers of any size, frames of any content and length from the
// backend side, a backend that fills up and drains, quiesce, driver reset, save/restore),
// plus the stream-protocol parser on raw bytes. No threads, no sockets: the backend is a
// fake that records what the device hands it. The device must never touch memory outside
// the guest's RAM, never crash, never hand the backend a frame outside [14, kMaxFrameLen]
// bytes or one the egress policy refuses, and every rx buffer it returns must hold a
// well-formed header and fit the buffer (checked here).
//
// libFuzzer (clang):
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Inative native/fuzz/net_fuzz.cc
//     native/devices/virtio/net/{net_device,egress_policy,tcp_flows}.cc native/devices/virtio/queue/queue.cc
//     native/devices/virtio/mmio/transport.cc native/base/guest_memory.cc native/base/event_loop.cc
//     native/common/error.cc -pthread -o net_fuzz
// Without clang, a random-input driver is built in (-DTORPOR_FUZZ_STANDALONE): ./net_fuzz [iterations] [seed]
// (both from native/fuzz/Makefile, target `net`; seeds in native/fuzz/corpus/net, make_seeds.py).
//
// Input: [event_idx u8] then records [op u8][...]: op % 10 = 0,1 a tx chain [len u16][bytes];
// 2 an rx buffer [len u16]; 3,4 a frame from the backend [len u16][bytes]; 5 backend room = op >> 4;
// 6 quiesce/unquiesce; 7 egress policy [guest port u16]; 8 save+restore [index u8][xor u8] or
// (op & 0x10) a driver reset; 9 the stream parser [len u8][bytes].
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "devices/virtio/mmio/test_driver.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/net/net_device.h"
#include "devices/virtio/net/stream_frame.h"
#include "devices/virtio/queue/mock.h"
#include "fuzz/reused_machine.h"

using namespace torpor;
using namespace torpor::virtio_net;
using torpor::testing::FakeRam;
using torpor::testing::MockDriverQueue;

namespace {

constexpr uint16_t kRing = 32;
constexpr uint64_t kRxRing = 0x0000, kTxRing = 0x8000, kBufs = 0x10000;
constexpr uint64_t kRamSize = 4 << 20;
const MacAddress kMac = {0x52, 0x54, 0x00, 1, 2, 3};

long g_tx = 0, g_rx = 0, g_frames = 0;

struct FakeBackend final : NetBackend {
  bool can_send() const override { return room > 0; }
  void send(const uint8_t* frame, size_t len) override {
    if (room == 0 || len < kEthHeaderLen || len > kMaxFrameLen) std::abort();
    if (policy && !egress_allows(*policy, frame, len)) std::abort();
    room--;
    g_tx++;
  }
  void rx_ready() override { ready_calls++; }
  int room = 8;
  int ready_calls = 0;
  const EgressPolicy* policy = nullptr;
};

struct Reader {
  const uint8_t* p;
  size_t n;
  uint8_t u8() { return n ? (n--, *p++) : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  size_t take(size_t want, const uint8_t** out) {
    size_t k = want < n ? want : n;
    *out = p;
    p += k;
    n -= k;
    return k;
  }
};

FakeRam& guest_ram() { return fuzz::reused_ram(kRamSize); }

struct Harness {
  FakeRam& ram = guest_ram();  // reused: all zero at an input's start (reused_machine.h)
  testing::CountingIrq irq;
  EventLoop& loop = fuzz::idle_loop();
  VirtioNetDevice* net = new VirtioNetDevice(ram.mem, kMac);
  VirtioMmioTransport dev{ram.mem, irq, loop, std::unique_ptr<VirtioDevice>(net)};
  MockDriverQueue rxq{ram.mem, kRxRing, kRing}, txq{ram.mem, kTxRing, kRing};
  FakeBackend backend;
  EgressPolicy policy;
  std::map<uint16_t, std::pair<uint64_t, uint32_t>> rx_posted;  // head -> buffer
  uint16_t rx_seen = 0;
  uint64_t next = kBufs;

  // A driver (re)starting lays out fresh rings; at an input's start RAM is all zero already.
  // Only the rings: nothing else below kBufs is ever written (a restore does not move them),
  // and zeroing all 64 KiB on every driver reset was ~6% of the cost.
  void init(bool event_idx, bool reset) {
    if (reset) {
      std::memset(ram.at(kRxRing), 0, rxq.end() - kRxRing);
      std::memset(ram.at(kTxRing), 0, txq.end() - kTxRing);
    }
    rxq.recycle();
    txq.recycle();
    rx_posted.clear();
    rx_seen = 0;
    testing::init_device(dev, {&rxq, &txq}, event_idx ? ~uint64_t{0} : ~virtio::kFRingEventIdx);
    std::lock_guard<std::mutex> lock(dev.lock());
    net->set_backend(&backend);
  }
  uint64_t alloc(uint32_t len) {
    if (next + len + 4096 > kRamSize) next = kBufs;
    uint64_t at = next;
    next += (len + 4095) & ~uint64_t{4095};
    return at;
  }
  void check_rx() {
    std::lock_guard<std::mutex> lock(dev.lock());
    while (rx_seen != rxq.used_idx()) {
      virtio::UsedElem e = rxq.used(rx_seen++);
      auto it = rx_posted.find(static_cast<uint16_t>(e.id));
      if (it == rx_posted.end()) continue;  // a chain the fuzzer laid out by hand
      auto [gpa, len] = it->second;
      if (e.len > len || e.len < kHeaderLen + kEthHeaderLen) std::abort();
      uint16_t num_buffers;
      std::memcpy(&num_buffers, ram.at(gpa + 10), 2);
      if (num_buffers != 1) std::abort();
      g_rx++;
    }
  }
};

}  // namespace

namespace {

void run_input(const uint8_t* data, size_t size) {
  Harness h;
  Reader in{data, size};
  h.init(in.u8() & 1, false);
  std::vector<uint8_t> frame;
  while (in.n > 0) {
    uint8_t op = in.u8();
    switch (op % 10) {
      case 0: case 1: {  // guest transmits: header + frame, one or two buffers, any length
        uint32_t len = in.u16() % (kMaxFrameLen + kHeaderLen + 64);
        if (len == 0) len = 1;
        uint64_t gpa = h.alloc(len);
        const uint8_t* bytes;
        size_t got = in.take(len, &bytes);
        h.ram.mem.write(gpa, bytes, got);  // through mem: marked dirty, zeroed after the input
        if ((op & 0x10) && len > kHeaderLen)
          h.txq.add_chain({{gpa, kHeaderLen, false}, {gpa + kHeaderLen, len - kHeaderLen, false}});
        else
          h.txq.add_chain({{gpa, len, (op & 0x20) != 0}});
        h.dev.notify(VirtioNetDevice::kTxQueue);
        break;
      }
      case 2: {  // guest posts an rx buffer
        uint32_t len = 1 + in.u16() % 3000;
        uint64_t gpa = h.alloc(len);
        uint16_t head = h.rxq.add_chain({{gpa, len, true}});
        h.rx_posted[head] = {gpa, len};
        h.dev.notify(VirtioNetDevice::kRxQueue);
        break;
      }
      case 3: case 4: {  // a frame from the network
        size_t len = in.u16() % 2000;
        const uint8_t* bytes;
        size_t got = in.take(len, &bytes);
        std::lock_guard<std::mutex> lock(h.dev.lock());
        h.net->receive(bytes, got);
        if (op & 0x10) h.net->end_rx_batch();
        g_frames++;
        break;
      }
      case 5: {  // the backend drains or fills
        std::lock_guard<std::mutex> lock(h.dev.lock());
        h.backend.room = op >> 4;
        h.net->tx_ready();
        break;
      }
      case 6:
        if (op & 0x10) h.dev.quiesce(); else h.dev.unquiesce();
        break;
      case 7: {  // egress policy
        std::lock_guard<std::mutex> lock(h.dev.lock());
        h.policy = EgressPolicy{};
        h.policy.egress = (op & 0x10) == 0;
        h.policy.guest_ports = {in.u16()};
        h.net->set_egress_policy(h.policy);
        h.backend.policy = &h.policy;
        break;
      }
      case 8: {  // save, restore into the same device, or a driver reset
        StateWriter w;
        {
          std::lock_guard<std::mutex> lock(h.dev.lock());
          h.net->save(w);
        }
        if (op & 0x10) {
          h.dev.unquiesce();
          h.init(op & 0x20, true);
        } else {
          std::vector<uint8_t> blob = w.take();
          if (!blob.empty()) blob[in.u8() % blob.size()] ^= in.u8();  // sometimes corrupt
          try {
            StateReader r(blob);
            std::lock_guard<std::mutex> lock(h.dev.lock());
            h.net->restore(r);
          } catch (const Error&) {
          }
        }
        break;
      }
      case 9: {  // the stream parser on raw bytes
        const uint8_t* bytes;
        size_t got = in.take(in.u8(), &bytes);
        size_t len = 0;
        auto st = net_stream::next_frame(bytes, got, kMaxFrameLen, &len);
        if (st == net_stream::Parse::kFrame && (len == 0 || len > kMaxFrameLen || len + 4 > got)) std::abort();
        break;
      }
    }
    h.check_rx();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  run_input(data, size);
  fuzz::reset_reused_machine(guest_ram());
  return 0;
}

#ifdef TORPOR_FUZZ_STANDALONE
int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 3000;
  std::mt19937_64 rng(argc > 2 ? std::atoll(argv[2]) : 1);
  std::vector<uint8_t> input;
  for (long it = 0; it < iterations; it++) {
    input.clear();
    input.push_back(static_cast<uint8_t>(rng()));
    int records = 1 + static_cast<int>(rng() % 60);
    for (int r = 0; r < records; r++) {
      uint8_t op = static_cast<uint8_t>(rng());
      input.push_back(op);
      // Lengths: mostly plausible frames, now and then anything.
      uint16_t len = static_cast<uint16_t>(rng() % 5 == 0 ? rng() : 12 + rng() % 1600);
      input.push_back(static_cast<uint8_t>(len));
      input.push_back(static_cast<uint8_t>(len >> 8));
      size_t body = (op % 10 <= 4) ? std::min<size_t>(len, 2000) : rng() % 8;
      for (size_t i = 0; i < body; i++) input.push_back(static_cast<uint8_t>(rng()));
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("net_fuzz: %ld random inputs, %ld frames sent to the backend, %ld rx buffers checked, "
              "%ld frames offered, no crash\n", iterations, g_tx, g_rx, g_frames);
  return 0;
}
#endif
