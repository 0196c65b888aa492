// virtio-net over the mock driver queue and a fake backend: frames out of
// the tx queue reach the backend byte for byte, frames from the backend land
// in rx buffers behind a well-formed header, and both directions stop (not
// buffer) when the other side is full.
#include <cstring>
#include <string>
#include <vector>

#include "devices/virtio/mmio/test_driver.h"
#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/net/net_device.h"
#include "test/check.h"

using namespace torpor;
using namespace torpor::testing;
using namespace torpor::virtio_net;

namespace {

constexpr uint64_t kRxRing = 0x10000, kTxRing = 0x20000;
constexpr uint64_t kBufs = 0x40000;
const MacAddress kMac = {0x52, 0x54, 0x00, 0x12, 0x34, 0x56};

class FakeBackend final : public NetBackend {
 public:
  bool can_send() const override { return sent.size() < capacity; }
  void send(const uint8_t* frame, size_t len) override { sent.emplace_back(frame, frame + len); }
  void rx_ready() override { rx_ready_calls++; }
  size_t capacity = 1000;
  std::vector<std::vector<uint8_t>> sent;
  int rx_ready_calls = 0;
};

std::vector<uint8_t> frame_of(size_t len, uint8_t seed) {
  std::vector<uint8_t> f(len);
  for (size_t i = 0; i < len; i++) f[i] = static_cast<uint8_t>(seed + i * 7);
  return f;
}

struct Rig {
  FakeRam ram{4 << 20};
  CountingIrq irq;
  EventLoop loop;
  MockDriverQueue rxq{ram.mem, kRxRing, 16}, txq{ram.mem, kTxRing, 16};
  VirtioNetDevice* net;
  VirtioMmioTransport dev;
  FakeBackend backend;
  uint64_t next_buf = kBufs;

  explicit Rig(bool event_idx = true)
      : net(new VirtioNetDevice(ram.mem, kMac)), dev(ram.mem, irq, loop, std::unique_ptr<VirtioDevice>(net)) {
    uint64_t wanted = event_idx ? ~uint64_t{0} : ~virtio::kFRingEventIdx;
    CHECK(init_device(dev, {&rxq, &txq}, wanted) & virtio::kStatusDriverOk);
    attach(&backend);
  }
  void attach(NetBackend* b) {
    std::lock_guard<std::mutex> lock(dev.lock());
    net->set_backend(b);
  }
  uint64_t alloc(uint32_t len) {
    uint64_t at = next_buf;
    next_buf += (len + 4095) & ~uint64_t{4095};
    return at;
  }
  // Guest sends one frame: header + frame in one buffer (or split in two).
  void transmit(const std::vector<uint8_t>& frame, bool split = false) {
    uint64_t at = alloc(static_cast<uint32_t>(kHeaderLen + frame.size()));
    std::memset(ram.at(at), 0, kHeaderLen);
    std::memcpy(ram.at(at + kHeaderLen), frame.data(), frame.size());
    if (split)
      txq.add_chain({{at, kHeaderLen, false}, {at + kHeaderLen, static_cast<uint32_t>(frame.size()), false}});
    else
      txq.add_chain({{at, static_cast<uint32_t>(kHeaderLen + frame.size()), false}});
  }
  uint64_t post_rx(uint32_t len = 1526) {
    uint64_t at = alloc(len);
    rxq.add_chain({{at, len, true}});
    return at;
  }
  bool deliver(const std::vector<uint8_t>& f) {
    std::lock_guard<std::mutex> lock(dev.lock());
    bool taken = net->receive(f.data(), f.size());
    net->end_rx_batch();
    return taken;
  }
  uint8_t config(uint64_t off) {
    uint8_t b = 0;
    dev.read(virtio_mmio::kConfig + off, &b, 1);
    return b;
  }
};

}  // namespace

TEST("virtio-net: offers MAC, STATUS and the ring features; config holds the MAC and the link") {
  Rig r;
  uint64_t f = read_device_features(r.dev);
  CHECK(f & kFMac);
  CHECK(f & kFStatus);
  CHECK(f & virtio::kFRingEventIdx);
  CHECK(!(f & kFMrgRxbuf));
  for (int i = 0; i < 6; i++) CHECK_EQ(r.config(i), kMac[i]);
  CHECK_EQ(r.config(6), uint8_t{kStatusLinkUp});
  CHECK_EQ(r.config(8), uint8_t{1});  // one queue pair
  CHECK_EQ(r.config(40), uint8_t{0});  // beyond the config space: zeros
  int irqs = r.irq.count.load();
  r.attach(nullptr);
  CHECK_EQ(r.config(6), uint8_t{0});
  CHECK(r.irq.count.load() > irqs);  // the link change is a config interrupt
}

TEST("virtio-net: tx frames reach the backend without their header, in order") {
  Rig r;
  auto a = frame_of(60, 1), b = frame_of(1514, 2);
  r.transmit(a);
  r.transmit(b, true);
  r.dev.notify(VirtioNetDevice::kTxQueue);
  CHECK_EQ(r.backend.sent.size(), size_t{2});
  CHECK(r.backend.sent[0] == a);
  CHECK(r.backend.sent[1] == b);
  CHECK_EQ(r.txq.used_idx(), uint16_t{2});
  CHECK_EQ(r.txq.used(0).len, 0u);
  CHECK_EQ(r.net->stats().tx_frames, uint64_t{2});
}

TEST("virtio-net: a full backend leaves tx chains on the ring until tx_ready") {
  Rig r;
  r.backend.capacity = 1;
  for (int i = 0; i < 3; i++) r.transmit(frame_of(100, static_cast<uint8_t>(i)));
  r.dev.notify(VirtioNetDevice::kTxQueue);
  CHECK_EQ(r.backend.sent.size(), size_t{1});
  CHECK_EQ(r.txq.used_idx(), uint16_t{1});
  r.backend.capacity = 10;
  {
    std::lock_guard<std::mutex> lock(r.dev.lock());
    r.net->tx_ready();
  }
  CHECK_EQ(r.backend.sent.size(), size_t{3});
  CHECK_EQ(r.txq.used_idx(), uint16_t{3});
  CHECK(r.backend.sent[2] == frame_of(100, 2));
  CHECK_EQ(r.net->stats().tx_stalls, uint64_t{1});
}

TEST("virtio-net: runt, oversized and header-only tx chains are dropped and returned") {
  Rig r;
  r.transmit(frame_of(10, 0));  // shorter than an Ethernet header
  uint64_t big = r.alloc(kHeaderLen + kMaxFrameLen + 1);
  r.txq.add_chain({{big, kHeaderLen + kMaxFrameLen + 1, false}});
  uint64_t w = r.alloc(64);
  r.txq.add_chain({{w, 64, true}});  // write-only: nothing to send
  r.dev.notify(VirtioNetDevice::kTxQueue);
  CHECK_EQ(r.backend.sent.size(), size_t{0});
  CHECK_EQ(r.txq.used_idx(), uint16_t{3});
  CHECK_EQ(r.net->stats().tx_dropped, uint64_t{3});
  CHECK(!(reg_read(r.dev, virtio_mmio::kStatus) & virtio::kStatusNeedsReset));
}

TEST("virtio-net: frames the egress policy refuses never reach the backend") {
  Rig r;
  EgressPolicy closed;
  closed.egress = false;
  {
    std::lock_guard<std::mutex> lock(r.dev.lock());
    r.net->set_egress_policy(closed);
  }
  auto ipv4 = frame_of(60, 0);
  ipv4[12] = 0x08;
  ipv4[13] = 0x00;
  auto arp = frame_of(60, 0);
  arp[12] = 0x08;
  arp[13] = 0x06;
  r.transmit(ipv4);
  r.transmit(arp);
  r.dev.notify(VirtioNetDevice::kTxQueue);
  CHECK_EQ(r.backend.sent.size(), size_t{1});
  CHECK(r.backend.sent[0] == arp);
  CHECK_EQ(r.net->stats().tx_filtered, uint64_t{1});
  CHECK_EQ(r.txq.used_idx(), uint16_t{2});
}

TEST("virtio-net: without a backend tx frames are consumed and dropped") {
  Rig r;
  r.attach(nullptr);
  r.transmit(frame_of(60, 0));
  r.dev.notify(VirtioNetDevice::kTxQueue);
  CHECK_EQ(r.txq.used_idx(), uint16_t{1});
  CHECK_EQ(r.net->stats().tx_dropped, uint64_t{1});
}

TEST("virtio-net: rx frames land behind a zeroed header with num_buffers 1, one interrupt per batch") {
  Rig r(false);
  uint64_t b0 = r.post_rx(), b1 = r.post_rx();
  auto a = frame_of(60, 9), b = frame_of(1514, 3);
  int irqs = r.irq.count.load();
  {
    std::lock_guard<std::mutex> lock(r.dev.lock());
    CHECK(r.net->receive(a.data(), a.size()));
    CHECK(r.net->receive(b.data(), b.size()));
    r.net->end_rx_batch();
  }
  CHECK_EQ(r.irq.count.load(), irqs + 1);
  CHECK_EQ(r.rxq.used_idx(), uint16_t{2});
  CHECK_EQ(r.rxq.used(0).len, kHeaderLen + 60);
  CHECK_EQ(r.rxq.used(1).len, kHeaderLen + 1514);
  uint8_t hdr[kHeaderLen] = {};
  hdr[10] = 1;
  CHECK(std::memcmp(r.ram.at(b0), hdr, kHeaderLen) == 0);
  CHECK(std::memcmp(r.ram.at(b0 + kHeaderLen), a.data(), a.size()) == 0);
  CHECK(std::memcmp(r.ram.at(b1 + kHeaderLen), b.data(), b.size()) == 0);
}

TEST("virtio-net: rx into a chain of several buffers") {
  Rig r;
  uint64_t h = r.alloc(kHeaderLen), d1 = r.alloc(100), d2 = r.alloc(2000);
  r.rxq.add_chain({{h, kHeaderLen, true}, {d1, 100, true}, {d2, 2000, true}});
  auto f = frame_of(1000, 5);
  CHECK(r.deliver(f));
  CHECK_EQ(r.rxq.used(0).len, kHeaderLen + 1000);
  CHECK(std::memcmp(r.ram.at(d1), f.data(), 100) == 0);
  CHECK(std::memcmp(r.ram.at(d2), f.data() + 100, 900) == 0);
}

TEST("virtio-net: no rx buffer refuses the frame; posting one asks the backend again") {
  Rig r;
  auto f = frame_of(60, 1);
  CHECK(!r.deliver(f));
  CHECK(!r.deliver(f));
  CHECK_EQ(r.net->stats().rx_refused, uint64_t{1});
  CHECK_EQ(r.backend.rx_ready_calls, 0);
  r.post_rx();
  r.dev.notify(VirtioNetDevice::kRxQueue);
  CHECK_EQ(r.backend.rx_ready_calls, 1);
  CHECK(r.deliver(f));
  CHECK_EQ(r.rxq.used_idx(), uint16_t{1});
}

TEST("virtio-net: a frame larger than the rx buffer is dropped and the buffer kept") {
  Rig r;
  r.post_rx(200);
  CHECK(r.deliver(frame_of(500, 1)));  // taken: dropped
  CHECK_EQ(r.rxq.used_idx(), uint16_t{0});
  CHECK_EQ(r.net->stats().rx_dropped, uint64_t{1});
  CHECK(r.deliver(frame_of(100, 1)));
  CHECK_EQ(r.rxq.used_idx(), uint16_t{1});
  CHECK(r.deliver(frame_of(5, 1)));  // a runt: dropped
  CHECK_EQ(r.net->stats().rx_dropped, uint64_t{2});
}

TEST("virtio-net: before the driver is up, received frames are dropped, not held") {
  FakeRam ram(1 << 20);
  CountingIrq irq;
  EventLoop loop;
  auto* net = new VirtioNetDevice(ram.mem, kMac);
  VirtioMmioTransport dev(ram.mem, irq, loop, std::unique_ptr<VirtioDevice>(net));
  FakeBackend b;
  std::lock_guard<std::mutex> lock(dev.lock());
  net->set_backend(&b);
  auto f = frame_of(60, 0);
  CHECK(net->receive(f.data(), f.size()));
  CHECK_EQ(net->stats().rx_dropped, uint64_t{1});
}

TEST("virtio-net: while quiesced nothing reaches guest memory; unquiesce asks the backend again") {
  Rig r;
  r.post_rx();
  r.dev.quiesce();
  CHECK(!r.deliver(frame_of(60, 0)));
  r.transmit(frame_of(60, 0));
  r.dev.notify(VirtioNetDevice::kTxQueue);
  CHECK_EQ(r.rxq.used_idx(), uint16_t{0});
  CHECK_EQ(r.txq.used_idx(), uint16_t{0});
  r.dev.unquiesce();
  CHECK_EQ(r.backend.rx_ready_calls, 1);
  CHECK_EQ(r.loop.posted_count(), size_t{1});  // the held tx notification, re-posted to the I/O thread
  r.dev.notify(VirtioNetDevice::kTxQueue);       // what that posted closure does
  CHECK_EQ(r.txq.used_idx(), uint16_t{1});
  CHECK(r.deliver(frame_of(60, 0)));
  CHECK_EQ(r.rxq.used_idx(), uint16_t{1});
}

TEST("virtio-net: save/restore keeps the MAC; bad blobs are SNAPSHOT_INVALID") {
  FakeRam ram(1 << 20);
  const MacAddress other = {0x02, 0, 0, 0, 0, 1};
  VirtioNetDevice a(ram.mem, kMac), b(ram.mem, other);
  StateWriter w;
  a.save(w);
  StateReader rd(w.data());
  b.restore(rd);
  CHECK(b.mac() == kMac);
  // A multicast MAC in the blob.
  auto bytes = w.data();
  size_t mac_at = bytes.size() - 7;
  bytes[mac_at] |= 1;
  bool threw = false;
  try {
    StateReader bad(bytes);
    b.restore(bad);
  } catch (const Error& e) {
    threw = std::string(e.code()) == code::kSnapshotInvalid;
  }
  CHECK(threw);
  threw = false;
  try {
    StateReader cut(w.data().data(), w.data().size() - 3);
    b.restore(cut);
  } catch (const Error& e) {
    threw = std::string(e.code()) == code::kSnapshotInvalid;
  }
  CHECK(threw);
  CHECK(b.mac() == kMac);
}

TEST("virtio-net: MAC text parsing") {
  MacAddress m;
  CHECK(parse_mac("52:54:00:AB:cd:ef", &m));
  CHECK(format_mac(m) == "52:54:00:ab:cd:ef");
  CHECK(!parse_mac("53:54:00:ab:cd:ef", &m));  // multicast
  CHECK(!parse_mac("52:54:00:ab:cd", &m));
  CHECK(!parse_mac("52-54-00-ab-cd-ef", &m));
  CHECK(!parse_mac("52:54:00:ab:cd:eg", &m));
}

// A TCP segment from the guest (10.0.2.15:40000 -> 192.0.2.7:80) with these flags.
static std::vector<uint8_t> guest_tcp(uint8_t flags) {
  std::vector<uint8_t> f(54, 0);
  std::memcpy(f.data() + 6, kMac.data(), 6);
  f[12] = 0x08;
  uint8_t* ip = f.data() + 14;
  const uint8_t hdr[20] = {0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 0, 2, 15, 192, 0, 2, 7};
  std::memcpy(ip, hdr, 20);
  uint8_t* tcp = ip + 20;
  tcp[0] = 40000 >> 8;
  tcp[1] = 40000 & 0xff;
  tcp[3] = 80;
  tcp[11] = 9;  // ack 9
  tcp[12] = 5 << 4;
  tcp[13] = flags;
  return f;
}

TEST("virtio-net: a TCP segment of a flow opened before the backend was attached is answered with an RST") {
  Rig r;
  r.transmit(guest_tcp(0x02));  // SYN: a flow this backend sees open
  r.transmit(guest_tcp(0x10));
  r.dev.notify(VirtioNetDevice::kTxQueue);
  CHECK_EQ(r.backend.sent.size(), size_t{2});
  FakeBackend fresh;  // what a restore or a replaced passt does
  r.attach(&fresh);
  uint64_t buf = r.post_rx();
  int irqs = r.irq.count.load();
  r.transmit(guest_tcp(0x18));
  r.dev.notify(VirtioNetDevice::kTxQueue);
  CHECK(fresh.sent.empty());
  CHECK_EQ(r.net->stats().tx_reset, uint64_t{1});
  CHECK_EQ(r.rxq.used_idx(), uint16_t{1});
  CHECK_EQ(r.rxq.used(0).len, kHeaderLen + 54);
  const uint8_t* rst = r.ram.at(buf + kHeaderLen);
  CHECK(std::memcmp(rst, kMac.data(), 6) == 0);
  CHECK_EQ(rst[14 + 20 + 13], uint8_t{0x04});
  CHECK_EQ(rst[14 + 20 + 7], uint8_t{9});  // seq = the segment's ack
  CHECK(r.irq.count.load() > irqs);
  // No rx buffer: the RST is dropped, nothing is owed to the backend; a new SYN goes through.
  r.transmit(guest_tcp(0x18));
  r.dev.notify(VirtioNetDevice::kTxQueue);
  CHECK_EQ(r.net->stats().tx_reset, uint64_t{2});
  CHECK_EQ(fresh.rx_ready_calls, 0);
  r.transmit(guest_tcp(0x02));
  r.dev.notify(VirtioNetDevice::kTxQueue);
  CHECK_EQ(fresh.sent.size(), size_t{1});
}
