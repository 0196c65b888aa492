// The stream backend between a real socketpair (the other end plays passt)
// and the virtio-net device over the mock driver queues, with the machine's
// EventLoop running: framing both ways, back-pressure, and a peer that dies
// or lies about a length taking the link down instead of the process.
#include "devices/virtio/net/stream_backend.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "devices/virtio/mmio/test_driver.h"
#include "devices/virtio/net/make_net.h"
#include "devices/virtio/net/stream_frame.h"
#include "test/check.h"

using namespace torpor;
using namespace torpor::testing;
using namespace torpor::virtio_net;

namespace {

constexpr uint64_t kRxRing = 0x10000, kTxRing = 0x20000, kBufs = 0x40000;
const MacAddress kMac = {0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc};

template <typename Pred>
bool eventually(Pred p, int ms = 5000) {
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (p()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return p();
}

std::vector<uint8_t> frame_of(size_t len, uint8_t seed) {
  std::vector<uint8_t> f(len);
  for (size_t i = 0; i < len; i++) f[i] = static_cast<uint8_t>(seed ^ (i * 13));
  return f;
}

std::vector<uint8_t> framed(const std::vector<uint8_t>& f) {
  std::vector<uint8_t> out(4 + f.size());
  net_stream::put_length(out.data(), static_cast<uint32_t>(f.size()));
  std::memcpy(out.data() + 4, f.data(), f.size());
  return out;
}

void write_all(int fd, const std::vector<uint8_t>& b) {
  size_t off = 0;
  while (off < b.size()) {
    ssize_t n = ::write(fd, b.data() + off, b.size() - off);
    CHECK(n > 0);
    off += static_cast<size_t>(n);
  }
}

// Reads exactly n bytes (or fails the test after 5 s).
std::vector<uint8_t> read_exact(int fd, size_t n) {
  std::vector<uint8_t> b(n);
  size_t off = 0;
  while (off < n) {
    pollfd p{fd, POLLIN, 0};
    CHECK(::poll(&p, 1, 5000) == 1);
    ssize_t got = ::read(fd, b.data() + off, n - off);
    CHECK(got > 0);
    off += static_cast<size_t>(got);
  }
  return b;
}

struct Rig {
  FakeRam ram{8 << 20};
  CountingIrq irq;
  EventLoop loop;
  MockDriverQueue rxq{ram.mem, kRxRing, 64}, txq{ram.mem, kTxRing, 64};
  std::unique_ptr<VirtioMmioTransport> dev;
  VirtioNetDevice* net = nullptr;  // inside dev
  int peer = -1;  // passt's end
  uint64_t next_buf = kBufs;

  Rig() {
    loop.start();
    auto device = std::make_unique<VirtioNetDevice>(ram.mem, kMac);
    net = device.get();
    dev = std::make_unique<VirtioMmioTransport>(ram.mem, irq, loop, std::move(device));
    CHECK(init_device(*dev, {&rxq, &txq}) & virtio::kStatusDriverOk);
    int sv[2];
    CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    peer = sv[1];
    virtio_net_attach_stream(*dev, Fd(sv[0]));
  }
  ~Rig() {
    dev.reset();
    loop.stop();
    if (peer >= 0) ::close(peer);
  }
  uint64_t post_rx(uint32_t len = 1526) {
    uint64_t at = next_buf;
    next_buf += 4096;
    {
      std::lock_guard<std::mutex> lock(dev->lock());
      rxq.add_chain({{at, len, true}});
    }
    dev->notify(0);
    return at;
  }
  void transmit(const std::vector<uint8_t>& f) {
    uint64_t at = next_buf;
    next_buf += (kHeaderLen + f.size() + 4095) & ~size_t{4095};
    std::memset(ram.at(at), 0, kHeaderLen);
    std::memcpy(ram.at(at + kHeaderLen), f.data(), f.size());
    {
      std::lock_guard<std::mutex> lock(dev->lock());
      txq.add_chain({{at, static_cast<uint32_t>(kHeaderLen + f.size()), false}});
    }
    dev->notify(1);
  }
  uint16_t rx_used() {
    std::lock_guard<std::mutex> lock(dev->lock());
    return rxq.used_idx();
  }
  bool link_up() {
    std::lock_guard<std::mutex> lock(dev->lock());
    return net->link_up();
  }
};

}  // namespace

TEST("net stream: next_frame parses the 4-byte big-endian length and refuses 0 and oversize") {
  uint8_t b[8] = {0, 0, 0, 3, 'a', 'b', 'c', 'd'};
  size_t len = 0;
  CHECK(net_stream::next_frame(b, 3, 100, &len) == net_stream::Parse::kNeedMore);
  CHECK(net_stream::next_frame(b, 6, 100, &len) == net_stream::Parse::kNeedMore);
  CHECK(net_stream::next_frame(b, 7, 100, &len) == net_stream::Parse::kFrame);
  CHECK_EQ(len, size_t{3});
  uint8_t zero[4] = {0, 0, 0, 0};
  CHECK(net_stream::next_frame(zero, 4, 100, &len) == net_stream::Parse::kBad);
  uint8_t huge[4] = {0xff, 0, 0, 0};
  CHECK(net_stream::next_frame(huge, 4, 100, &len) == net_stream::Parse::kBad);
}

TEST("net stream: guest frames come out framed; framed frames reach the guest") {
  Rig r;
  auto out = frame_of(1514, 1);
  r.transmit(out);
  auto got = read_exact(r.peer, 4 + out.size());
  CHECK(got == framed(out));

  uint64_t b0 = r.post_rx(), b1 = r.post_rx();
  auto in1 = frame_of(60, 2), in2 = frame_of(1500, 3);
  // Both frames in one write, the second split across two writes.
  auto bytes = framed(in1);
  auto second = framed(in2);
  bytes.insert(bytes.end(), second.begin(), second.begin() + 700);
  write_all(r.peer, bytes);
  CHECK(eventually([&] { return r.rx_used() == 1; }));
  write_all(r.peer, std::vector<uint8_t>(second.begin() + 700, second.end()));
  CHECK(eventually([&] { return r.rx_used() == 2; }));
  CHECK(std::memcmp(r.ram.at(b0 + kHeaderLen), in1.data(), in1.size()) == 0);
  CHECK(std::memcmp(r.ram.at(b1 + kHeaderLen), in2.data(), in2.size()) == 0);
}

TEST("net stream: with no rx buffers the backend stops reading and resumes when buffers come") {
  Rig r;
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 5; i++) {
    auto f = framed(frame_of(100, static_cast<uint8_t>(i)));
    bytes.insert(bytes.end(), f.begin(), f.end());
  }
  write_all(r.peer, bytes);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_EQ(r.rx_used(), uint16_t{0});
  std::vector<uint64_t> bufs;
  for (int i = 0; i < 5; i++) bufs.push_back(r.post_rx());
  CHECK(eventually([&] { return r.rx_used() == 5; }));
  for (int i = 0; i < 5; i++) {
    auto f = frame_of(100, static_cast<uint8_t>(i));
    CHECK(std::memcmp(r.ram.at(bufs[i] + kHeaderLen), f.data(), f.size()) == 0);
  }
}

TEST("net stream: a peer that stops reading stalls tx at a bounded buffer, then drains") {
  Rig r;
  // 1 MiB of guest frames against a peer not reading: the socket buffer and
  // the backend's bounded buffer fill, the rest stays on the tx ring.
  constexpr int kFrames = 60;
  for (int i = 0; i < kFrames; i++) {
    r.transmit(frame_of(16000, static_cast<uint8_t>(i)));
    if (i == 30) CHECK(r.txq.used_idx() < 31);  // at least one frame is waiting
  }
  uint64_t stalls;
  {
    std::lock_guard<std::mutex> lock(r.dev->lock());
    stalls = r.net->stats().tx_stalls;
  }
  CHECK(stalls >= 1);
  for (int i = 0; i < kFrames; i++) {
    auto got = read_exact(r.peer, 4 + 16000);
    CHECK(got == framed(frame_of(16000, static_cast<uint8_t>(i))));
  }
  CHECK(eventually([&] {
    std::lock_guard<std::mutex> lock(r.dev->lock());
    return r.txq.used_idx() == kFrames;
  }));
}

// passt reads the stream in large non-blocking reads and loses its place when one ends inside
// a frame (stream_backend.cc, flush_out): however the backlog drains, every read the peer makes
// must end on a frame boundary.
TEST("net stream: a peer's reads always end on a frame boundary, also while a backlog drains") {
  Rig r;
  int small = 32 * 1024;  // a small socket buffer: the backlog outgrows it many times over
  CHECK(::setsockopt(r.peer, SOL_SOCKET, SO_RCVBUF, &small, sizeof small) == 0);
  constexpr int kFrames = 400;
  std::thread guest([&] {
    for (int i = 0; i < kFrames; i++) {
      // Never more chains in flight than the 64-entry ring holds.
      eventually([&] {
        std::lock_guard<std::mutex> lock(r.dev->lock());
        return static_cast<uint16_t>(i - r.txq.used_idx()) < 48;
      }, 20000);
      r.transmit(frame_of(1514, static_cast<uint8_t>(i)));
    }
  });
  std::vector<uint8_t> got;
  size_t reads = 0, torn = 0;
  std::vector<uint8_t> buf(1 << 20);
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.size() < size_t{kFrames} * (4 + 1514) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ssize_t n = ::recv(r.peer, buf.data(), buf.size(), MSG_DONTWAIT);
    if (n <= 0) continue;
    reads++;
    got.insert(got.end(), buf.begin(), buf.begin() + n);
    if (got.size() % (4 + 1514) != 0) torn++;
  }
  guest.join();
  CHECK(reads > 1);
  CHECK_EQ(torn, size_t{0});
  CHECK_EQ(got.size(), size_t{kFrames} * (4 + 1514));
  for (int i = 0; i < kFrames; i++) {
    auto want = framed(frame_of(1514, static_cast<uint8_t>(i)));
    CHECK(std::memcmp(got.data() + size_t(i) * want.size(), want.data(), want.size()) == 0);
  }
}

TEST("net stream: a peer that closes or sends a bad length takes the link down, with a reason") {
  {
    Rig r;
    CHECK(r.link_up());
    ::close(r.peer);
    r.peer = -1;
    CHECK(eventually([&] { return !r.link_up(); }));
    CHECK(virtio_net_backend_error(*r.dev).find("closed") != std::string::npos);
    r.transmit(frame_of(60, 0));  // dropped, not stuck
    CHECK(eventually([&] {
      std::lock_guard<std::mutex> lock(r.dev->lock());
      return r.txq.used_idx() == 1;
    }));
  }
  {
    Rig r;
    r.post_rx();
    write_all(r.peer, {0x7f, 0, 0, 0, 1, 2, 3});
    CHECK(eventually([&] { return !r.link_up(); }));
    CHECK(virtio_net_backend_error(*r.dev).find("length") != std::string::npos);
    CHECK_EQ(r.rx_used(), uint16_t{0});
  }
}

TEST("net stream: a new backend replaces a dead one; the link comes back") {
  Rig r;
  ::close(r.peer);
  CHECK(eventually([&] { return !r.link_up(); }));
  int sv[2];
  CHECK(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  r.peer = sv[1];
  virtio_net_attach_stream(*r.dev, Fd(sv[0]));
  CHECK(r.link_up());
  auto f = frame_of(80, 7);
  r.transmit(f);
  CHECK(read_exact(r.peer, 4 + f.size()) == framed(f));
}

TEST("net stream: connecting to a path nobody listens on is NET_BACKEND") {
  bool threw = false;
  try {
    connect_unix_stream("/nonexistent/torpor-passt.sock");
  } catch (const Error& e) {
    threw = std::string(e.code()) == code::kNetBackend;
  }
  CHECK(threw);
}
