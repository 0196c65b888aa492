// Fuzz target: the virtio-vsock device fed packet sequences the fuzzer
// controls (headers, payloads, chain layouts, credit values, shutdowns),
// mixed with host-side actions (writes, reads, close, transport reset,
// driver reset), over a live connection. The device must never touch memory
// outside the guest's RAM, never crash, and every packet it writes to the
// guest must be well formed (checked here).
//
// libFuzzer (clang):
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Inative
//     native/fuzz/vsock_fuzz.cc native/devices/virtio/vsock/{packet,connection,vsock_device,make_vsock}.cc
//     native/devices/virtio/queue/queue.cc native/devices/virtio/mmio/transport.cc
//     native/base/guest_memory.cc native/base/event_loop.cc native/common/error.cc -pthread -o vsock_fuzz
// Without clang (g++ only), a random-input driver is built in:
//   g++ -std=c++20 -O1 -fsanitize=address,undefined -fno-sanitize-recover=all -DTORPOR_FUZZ_STANDALONE -Inative <same sources> -pthread
//   ./vsock_fuzz [iterations] [seed]
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "devices/virtio/mmio/test_driver.h"
#include "devices/virtio/queue/mock.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/vsock/vsock_device.h"
#include "fuzz/reused_machine.h"

using namespace torpor;
using namespace torpor::vsock;
using torpor::testing::FakeRam;
using torpor::testing::MockDriverQueue;

namespace {

constexpr uint64_t kCid = 3;
constexpr uint16_t kRing = 64;
constexpr uint32_t kRxBuf = 44 + 4096;
constexpr uint64_t kRxBase = 0x40000, kTxBase = 0x100000, kEvBase = 0x3000;
constexpr uint32_t kGuestPort = 5000;

long g_packets = 0, g_rx = 0, g_established = 0;

// Guest RAM and the loop are reused across inputs (reused_machine.h): the RAM is all zero at
// an input's start (zeroing all 2 MiB per input was ~15% of an input's cost; now only the
// pages it wrote are). The loop never starts: run_pending() runs what the device posted, on
// this thread (no thread hop per record, no thread at all).
FakeRam& guest_ram() { return fuzz::reused_ram(2 << 20); }

struct Harness {
  FakeRam& ram = guest_ram();
  testing::CountingIrq irq;
  EventLoop& loop = fuzz::idle_loop();
  std::unique_ptr<VirtioMmioTransport> dev;
  VsockDevice* vsock = nullptr;  // inside dev
  MockDriverQueue rxq{ram.mem, 0x0000, kRing}, txq{ram.mem, 0x1000 * 8, kRing}, evq{ram.mem, 0x1000 * 16, kRing};
  std::array<uint64_t, kRing> rx_gpa{};  // by head descriptor; 0: none posted (kRxBase > 0)
  uint16_t rx_seen = 0;
  uint64_t rx_slot = 0, tx_slot = 0;
  int fd = -1;
  uint32_t host_port = 0;

  Harness() {
    auto device = std::make_unique<VsockDevice>(ram.mem, loop, kCid);
    vsock = device.get();
    dev = std::make_unique<VirtioMmioTransport>(ram.mem, irq, loop, std::move(device));
    // Guest REQUESTs to these are knocks: counted and reported (nothing queued per knock).
    vsock->set_knock_ports({1, 1023}, [] {});
    init(false);
  }
  ~Harness() {
    dev.reset();
    loop.run_pending();  // completions posted by the teardown
    if (fd >= 0) close(fd);
  }
  void init(bool reset) {
    testing::reg_write(*dev, virtio_mmio::kStatus, 0);  // a driver (re)starting resets first...
    if (reset) clear_rings();                            // ...and lays out fresh rings (RAM is
                                                         // all zero at an input's start)
    rxq.recycle();
    txq.recycle();
    evq.recycle();
    rx_seen = 0;
    testing::init_device(*dev, {&rxq, &txq, &evq});
    std::lock_guard<std::mutex> lock(dev->lock());
    for (int i = 0; i < 16; i++) post_rx_locked();
    evq.add_chain({{kEvBase, 4, true}});
  }
  // The rings and the event buffer: all that lies below the rx buffers (zeroing the 68 KiB
  // from 0 to the event ring's end on every driver reset cost more than the rings).
  void clear_rings() {
    for (const MockDriverQueue* q : {&rxq, &txq, &evq}) std::memset(ram.at(q->desc_table()), 0, q->end() - q->desc_table());
    std::memset(ram.at(kEvBase), 0, 4);
  }
  void post_rx_locked() {
    uint64_t gpa = kRxBase + (rx_slot++ % 32) * kRxBuf;
    rx_gpa[rxq.add_chain({{gpa, kRxBuf, true}}) % kRing] = gpa;
  }
  // Checks every packet the device wrote; re-posts the buffers. Returns the
  // source port of the last REQUEST seen (or 0).
  uint32_t drain_rx() {
    uint32_t request_port = 0;
    {
      std::lock_guard<std::mutex> lock(dev->lock());
      while (rx_seen != rxq.used_idx()) {
        virtio::UsedElem e = rxq.used(rx_seen++);
        if (e.id >= kRing || rx_gpa[e.id] == 0) std::abort();
        Header h;
        std::memcpy(&h, ram.at(rx_gpa[e.id]), sizeof h);
        if (e.len < sizeof h || e.len - sizeof h != h.len || h.len > kRxBuf - sizeof h) std::abort();
        if (h.src_cid != kHostCid || h.dst_cid != kCid || h.type != kTypeStream) std::abort();
        if (h.op == kOpInvalid || h.op > kOpCreditRequest) std::abort();
        if (h.op == kOpRequest) request_port = h.src_port;
        g_rx++;
        post_rx_locked();
      }
    }
    dev->notify(VsockDevice::kRxQueue);
    return request_port;
  }
  void send(const uint8_t* bytes, size_t len, bool split, long chain_len) {
    {
      std::lock_guard<std::mutex> lock(dev->lock());
      uint64_t gpa = kTxBase + (tx_slot++ % 4) * 0x20000;
      static const Header zero{};  // through mem: marked dirty, zeroed after the input
      ram.mem.write(gpa, &zero, sizeof zero);
      ram.mem.write(gpa, bytes, std::min<size_t>(len, 0x1f000));
      uint32_t total = static_cast<uint32_t>(chain_len >= 0 ? chain_len : static_cast<long>(len));
      if (total == 0) total = 1;  // zero-length descriptors are the queue's business, tested there
      if (split && total > sizeof(Header))
        txq.add_chain({{gpa, static_cast<uint32_t>(sizeof(Header)), false},
                       {gpa + sizeof(Header), total - static_cast<uint32_t>(sizeof(Header)), false}});
      else
        txq.add_chain({{gpa, total, false}});
    }
    dev->notify(VsockDevice::kTxQueue);
    g_packets++;
  }
  void send_header(const Header& h) { send(reinterpret_cast<const uint8_t*>(&h), sizeof h, false, -1); }
  Header conn_header(uint16_t op) {
    Header h{};
    h.src_cid = kCid;
    h.dst_cid = kHostCid;
    h.src_port = kGuestPort;
    h.dst_port = host_port;
    h.type = kTypeStream;
    h.op = op;
    h.buf_alloc = 64 * 1024;
    return h;
  }
  void establish() {
    auto got = std::make_shared<int>(-1);
    vsock->connect(kGuestPort, 0, [got](int f, const char*, const std::string&) { *got = f; });
    loop.run_pending();
    host_port = drain_rx();
    if (!host_port) return;
    send_header(conn_header(kOpResponse));
    loop.run_pending();
    fd = *got;
    if (fd >= 0) g_established++;
  }
};

}  // namespace

// Input: [mode u8] then records [ctl u8][len u16][len bytes]. mode & 1: a
// host connection is established first (a socketpair, the one fd pair an
// input may cost); without it the packets meet a device with no connection.
namespace {

void run_input(const uint8_t* data, size_t size) {
  Harness h;
  if (data[0] & 1) h.establish();
  size_t pos = 1;
  uint8_t sink[65536];
  while (pos + 3 <= size) {
    uint8_t ctl = data[pos];
    size_t len = std::min<size_t>(data[pos + 1] | (data[pos + 2] << 8), size - pos - 3);
    const uint8_t* body = data + pos + 3;
    pos += 3 + len;
    switch (ctl & 7) {
      case 0: case 1: case 2: case 3: {
        static std::vector<uint8_t> pkt;  // its capacity kept: no allocation per packet
        pkt.assign(body, body + len);
        if (pkt.size() < sizeof(Header)) pkt.resize(sizeof(Header));
        Header hd;
        std::memcpy(&hd, pkt.data(), sizeof hd);
        if (ctl & 0x08) {  // aim it at the live connection so it gets past the checks
          Header fix = h.conn_header(static_cast<uint16_t>(1 + hd.op % 7));
          fix.flags = hd.flags;
          fix.buf_alloc = hd.buf_alloc;
          fix.fwd_cnt = hd.fwd_cnt;
          fix.len = (ctl & 0x40) ? hd.len : static_cast<uint32_t>(pkt.size() - sizeof hd);
          hd = fix;
        }
        std::memcpy(pkt.data(), &hd, sizeof hd);
        long chain_len = (ctl & 0x20) ? static_cast<long>(hd.len % (kMaxPayload + 100)) : -1;
        h.send(pkt.data(), pkt.size(), ctl & 0x10, chain_len);
        break;
      }
      case 4:
        if (h.fd >= 0) {
          ssize_t ignored = send(h.fd, body, len, MSG_DONTWAIT | MSG_NOSIGNAL);
          (void)ignored;
        }
        break;
      case 5:
        if (h.fd >= 0) {
          ssize_t ignored = recv(h.fd, sink, sizeof sink, MSG_DONTWAIT);
          (void)ignored;
        }
        break;
      case 6:
        h.drain_rx();
        break;
      case 7:
        if (ctl & 0x08) {
          h.vsock->transport_reset();
        } else if (ctl & 0x10) {
          if (h.fd >= 0) close(h.fd);
          h.fd = -1;
        } else {
          h.init(true);  // driver reset and bring-up again
        }
        break;
    }
    h.loop.run_pending();
  }
  h.drain_rx();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  run_input(data, size);
  fuzz::reset_reused_machine(guest_ram());
  return 0;
}

#ifdef TORPOR_FUZZ_STANDALONE
// Random record sequences, biased towards packets aimed at the live
// connection with plausible ops, lengths and credit values.
int main(int argc, char** argv) {
  long iterations = argc > 1 ? std::atol(argv[1]) : 2000;
  std::mt19937_64 rng(argc > 2 ? std::atoll(argv[2]) : 1);
  std::vector<uint8_t> input;
  for (long it = 0; it < iterations; it++) {
    input.clear();
    input.push_back(rng() % 8 ? 1 : 0);
    int records = 1 + static_cast<int>(rng() % 40);
    for (int r = 0; r < records; r++) {
      uint8_t ctl = static_cast<uint8_t>(rng());
      if (rng() % 3) ctl = static_cast<uint8_t>((ctl & ~7) | (rng() % 4)) | 0x08;  // mostly packets at the connection
      size_t len = rng() % 4 == 0 ? rng() % 70000 : sizeof(Header) + rng() % 512;
      input.push_back(ctl);
      input.push_back(static_cast<uint8_t>(len));
      input.push_back(static_cast<uint8_t>(len >> 8));
      size_t start = input.size();
      for (size_t i = 0; i < (len & 0xffff); i++) input.push_back(static_cast<uint8_t>(rng()));
      if ((len & 0xffff) >= sizeof(Header) && rng() % 2) {
        // small credit values and lengths are more interesting than random ones
        uint32_t small = static_cast<uint32_t>(rng() % 70000);
        std::memcpy(&input[start + 24], &small, 4);  // len
        uint32_t credit = static_cast<uint32_t>(rng() % 300000);
        std::memcpy(&input[start + 36], &credit, 4);  // buf_alloc
      }
    }
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  std::printf("vsock_fuzz: %ld random inputs, %ld packets sent, %ld packets from the device checked, "
              "%ld connections established, no crash\n",
              iterations, g_packets, g_rx, g_established);
  return 0;
}
#endif
