// End-to-end tests of the vsock device: the real virtio-mmio transport and
// virtqueues over fake guest memory, a driver-side mock playing the guest's
// vsock driver, real socketpairs and a running EventLoop.
#include "devices/virtio/vsock/vsock_device.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "devices/virtio/mmio/transport.h"
#include "devices/virtio/queue/mock.h"
#include "test/check.h"

using namespace torpor;
using namespace torpor::vsock;
using torpor::testing::FakeRam;
using torpor::testing::MockDriverQueue;
namespace mmio = torpor::virtio_mmio;

namespace {

using Ms = std::chrono::milliseconds;

class CountingIrq : public IrqLine {
 public:
  void set_level(bool) override {}
  void trigger() override { triggers++; }
  std::atomic<int> triggers{0};
};

struct Packet {
  Header h;
  std::string data;
};

struct ConnectResult {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  int fd = -1;
  std::string code, message;
  bool wait(int ms) {
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_for(lock, Ms(ms), [&] { return done; });
  }
};

constexpr uint64_t kCid = 3;
constexpr uint16_t kRing = 64;
constexpr uint32_t kRxBuf = 4096;
constexpr uint64_t kRxBase = 0x100000, kTxBase = 0x200000, kEvBase = 0x300000;

// Plays the guest: sets the device up through its MMIO registers, keeps rx
// buffers posted, sends packets on tx, reads what the device wrote.
class Guest {
 public:
  explicit Guest(bool event_idx = true, int event_buffers = 2) {
    loop.start();
    auto device = std::make_unique<VsockDevice>(ram.mem, loop, kCid);
    host = device.get();
    dev = std::make_unique<VirtioMmioTransport>(ram.mem, irq, loop, std::move(device));
    reg(mmio::kStatus, 1 | 2);
    reg(mmio::kDriverFeaturesSel, 1);
    reg(mmio::kDriverFeatures, 1);  // VERSION_1
    reg(mmio::kDriverFeaturesSel, 0);
    reg(mmio::kDriverFeatures, event_idx ? (1u << 29) : 0);
    reg(mmio::kStatus, 1 | 2 | 8);
    MockDriverQueue* qs[3] = {&rxq, &txq, &evq};
    for (uint32_t i = 0; i < 3; i++) {
      reg(mmio::kQueueSel, i);
      reg(mmio::kQueueNum, kRing);
      reg(mmio::kQueueDescLow, static_cast<uint32_t>(qs[i]->desc_table()));
      reg(mmio::kQueueDriverLow, static_cast<uint32_t>(qs[i]->avail_ring()));
      reg(mmio::kQueueDeviceLow, static_cast<uint32_t>(qs[i]->used_ring()));
      reg(mmio::kQueueReady, 1);
    }
    {
      std::lock_guard<std::mutex> lock(dev->lock());
      for (int i = 0; i < 32; i++) post_rx_locked();
      for (int i = 0; i < event_buffers; i++) post_event_locked();
    }
    reg(mmio::kStatus, 1 | 2 | 8 | 4);
  }
  ~Guest() {
    dev.reset();
    loop.stop();
  }

  void reg(uint64_t off, uint32_t v) { dev->write(off, reinterpret_cast<const uint8_t*>(&v), 4); }
  uint32_t status() { return dev->status(); }

  void post_rx_locked() {
    uint64_t gpa = kRxBase + (rx_slot++ % 64) * kRxBuf;
    uint16_t head = rxq.add_chain({{gpa, kRxBuf, true}});
    rx_gpa[head] = gpa;
  }
  void post_event_locked() {
    uint64_t gpa = kEvBase + (ev_slot++ % 8) * 64;
    evq.add_chain({{gpa, 4, true}});
  }
  void post_event() {
    {
      std::lock_guard<std::mutex> lock(dev->lock());
      post_event_locked();
    }
    dev->notify(VsockDevice::kEventQueue);
  }
  uint16_t events_used() {
    std::lock_guard<std::mutex> lock(dev->lock());
    return evq.used_idx();
  }
  uint32_t event_id(uint16_t slot) {
    std::lock_guard<std::mutex> lock(dev->lock());
    virtio::UsedElem e = evq.used(slot);
    uint32_t id;
    std::memcpy(&id, ram.at(kEvBase + (slot % 8) * 64), 4);
    return e.len == 4 ? id : 0xdead;
  }

  // Moves every packet the device wrote into `inbox`, re-posting the buffers.
  void collect() {
    bool reposted = false;
    {
      std::lock_guard<std::mutex> lock(dev->lock());
      while (rx_seen != rxq.used_idx()) {
        virtio::UsedElem e = rxq.used(rx_seen++);
        uint64_t gpa = rx_gpa.at(static_cast<uint16_t>(e.id));
        Packet p;
        std::memcpy(&p.h, ram.at(gpa), sizeof p.h);
        if (e.len < sizeof(Header) || e.len - sizeof(Header) != p.h.len) throw std::runtime_error("bad used len");
        p.data.assign(reinterpret_cast<const char*>(ram.at(gpa + sizeof(Header))), p.h.len);
        if (std::getenv("VSOCK_TRACE")) fprintf(stderr, "rx op %s %u->%u len %u flags %u\n", op_name(p.h.op), p.h.src_port, p.h.dst_port, p.h.len, p.h.flags);
        inbox.push_back(std::move(p));
        post_rx_locked();
        reposted = true;
      }
    }
    if (reposted) dev->notify(VsockDevice::kRxQueue);
  }
  // Waits for the first packet in the inbox matching `pred`, removes and returns it.
  template <typename Pred>
  bool next(Pred pred, Packet* out, int ms = 2000) {
    auto end = std::chrono::steady_clock::now() + Ms(ms);
    for (;;) {
      collect();
      for (size_t i = 0; i < inbox.size(); i++) {
        if (pred(inbox[i])) {
          if (out) *out = inbox[i];
          inbox.erase(inbox.begin() + static_cast<long>(i));
          return true;
        }
      }
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(Ms(1));
    }
  }
  bool next_op(uint16_t op, Packet* out, int ms = 2000) {
    return next([op](const Packet& p) { return p.h.op == op; }, out, ms);
  }

  Header hdr(uint16_t op, uint32_t src_port, uint32_t dst_port, uint32_t len = 0, uint32_t flags = 0) {
    Header h{};
    h.src_cid = kCid;
    h.dst_cid = kHostCid;
    h.src_port = src_port;
    h.dst_port = dst_port;
    h.len = len;
    h.type = kTypeStream;
    h.op = op;
    h.flags = flags;
    h.buf_alloc = buf_alloc;
    h.fwd_cnt = fwd_cnt;
    return h;
  }
  // Puts a packet on the tx queue (header and payload as two descriptors, as
  // Linux does; `chain_len` < 0: the real size) and kicks.
  void send(const Header& h, const std::string& payload = "", long chain_len = -1) {
    {
      std::lock_guard<std::mutex> lock(dev->lock());
      uint64_t gpa = kTxBase + (tx_slot++ % 8) * 0x20000;
      std::memcpy(ram.at(gpa), &h, sizeof h);
      std::memcpy(ram.at(gpa + 0x1000), payload.data(), payload.size());
      if (chain_len >= 0) {
        txq.add_chain({{gpa, static_cast<uint32_t>(chain_len), false}});
      } else if (payload.empty()) {
        txq.add_chain({{gpa, sizeof h, false}});
      } else {
        txq.add_chain({{gpa, sizeof h, false}, {gpa + 0x1000, static_cast<uint32_t>(payload.size()), false}});
      }
    }
    dev->notify(VsockDevice::kTxQueue);
  }

  std::shared_ptr<ConnectResult> connect(uint32_t port, uint32_t timeout_ms = 2000) {
    auto r = std::make_shared<ConnectResult>();
    host->connect(port, timeout_ms, [r](int fd, const char* code, const std::string& msg) {
      std::lock_guard<std::mutex> lock(r->m);
      r->fd = fd;
      r->code = code ? code : "";
      r->message = msg;
      r->done = true;
      r->cv.notify_all();
    });
    return r;
  }
  // Host connects to guest port `port`; the guest accepts. Returns the host fd
  // and sets *host_port to the host's ephemeral port.
  int establish(uint32_t port, uint32_t* host_port) {
    auto r = connect(port);
    Packet req;
    if (!next_op(kOpRequest, &req)) throw std::runtime_error("no REQUEST");
    if (req.h.dst_port != port || req.h.src_cid != kHostCid || req.h.dst_cid != kCid)
      throw std::runtime_error("bad REQUEST");
    *host_port = req.h.src_port;
    send(hdr(kOpResponse, port, req.h.src_port));
    if (!r->wait(2000) || r->fd < 0) throw std::runtime_error("connect did not complete: " + r->code);
    return r->fd;
  }
  VsockStats stats() { return host->stats(); }

  FakeRam ram{4 << 20};
  CountingIrq irq;
  EventLoop loop;
  std::unique_ptr<VirtioMmioTransport> dev;
  VsockDevice* host = nullptr;  // inside dev
  MockDriverQueue rxq{ram.mem, 0x0000, kRing}, txq{ram.mem, 0x8000, kRing}, evq{ram.mem, 0x10000, kRing};
  std::map<uint16_t, uint64_t> rx_gpa;
  uint16_t rx_seen = 0;
  uint64_t rx_slot = 0, tx_slot = 0, ev_slot = 0;
  std::vector<Packet> inbox;
  uint32_t buf_alloc = 256 * 1024;  // what the guest advertises
  uint32_t fwd_cnt = 0;
};

// Reads exactly n bytes (or until EOF / timeout).
std::string read_n(int fd, size_t n, int ms = 2000) {
  std::string out;
  auto end = std::chrono::steady_clock::now() + Ms(ms);
  while (out.size() < n && std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10) <= 0) continue;
    char buf[65536];
    ssize_t r = read(fd, buf, std::min(sizeof buf, n - out.size()));
    if (r <= 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}
// True when the fd reads EOF within ms (after draining data).
bool sees_eof(int fd, int ms = 2000) {
  auto end = std::chrono::steady_clock::now() + Ms(ms);
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10) <= 0) continue;
    char buf[4096];
    ssize_t r = read(fd, buf, sizeof buf);
    if (r == 0) return true;
    if (r < 0 && errno != EAGAIN) return true;
  }
  return false;
}
void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = write(fd, s.data() + off, s.size() - off);
    if (n > 0) off += static_cast<size_t>(n);
    else if (n < 0 && errno != EAGAIN) throw std::runtime_error("write failed");
    else {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, 10);
    }
  }
}
std::string pattern(size_t n, size_t seed = 0) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i++) s[i] = static_cast<char>('a' + (i * 7 + seed) % 26);
  return s;
}

}  // namespace

TEST("vsock device: config space holds the guest CID; device is live") {
  Guest g;
  CHECK_EQ(g.status() & virtio::kStatusNeedsReset, 0u);
  uint8_t cfg[8];
  g.dev->read(mmio::kConfig, cfg, 4);
  g.dev->read(mmio::kConfig + 4, cfg + 4, 4);
  uint64_t cid;
  std::memcpy(&cid, cfg, 8);
  CHECK_EQ(cid, kCid);
  uint32_t id;
  g.dev->read(mmio::kDeviceId, reinterpret_cast<uint8_t*>(&id), 4);
  CHECK_EQ(id, 19u);
}

TEST("vsock device: connect, then data both ways") {
  Guest g;
  uint32_t hp = 0;
  int fd = g.establish(5000, &hp);
  CHECK(hp >= 1024);
  write_all(fd, "hello");
  Packet p;
  CHECK(g.next_op(kOpRw, &p));
  CHECK(p.data == "hello");
  CHECK_EQ(p.h.src_port, hp);
  CHECK_EQ(p.h.dst_port, 5000u);
  CHECK_EQ(p.h.buf_alloc, Connection::kDefaultBufAlloc);
  g.send(g.hdr(kOpRw, 5000, hp, 5), "world");
  CHECK(read_n(fd, 5) == "world");
  // A single-descriptor packet (header and payload in one buffer) works too.
  Header h = g.hdr(kOpRw, 5000, hp, 3);
  std::string one(reinterpret_cast<const char*>(&h), sizeof h);
  {
    std::lock_guard<std::mutex> lock(g.dev->lock());
    std::memcpy(g.ram.at(kTxBase + 0x1f0000), one.data(), one.size());
    std::memcpy(g.ram.at(kTxBase + 0x1f0000 + sizeof h), "abc", 3);
    g.txq.add_chain({{kTxBase + 0x1f0000, static_cast<uint32_t>(sizeof h + 3), false}});
  }
  g.dev->notify(VsockDevice::kTxQueue);
  CHECK(read_n(fd, 3) == "abc");
  CHECK(g.irq.triggers > 0);
  VsockStats s = g.stats();
  CHECK_EQ(s.connections, uint64_t{1});
  CHECK_EQ(s.dropped, uint64_t{0});
  close(fd);
}

TEST("vsock device: host -> guest stays within the guest's credit") {
  Guest g;
  g.buf_alloc = 1000;
  uint32_t hp = 0;
  int fd = g.establish(5001, &hp);
  std::string msg = pattern(3000);
  write_all(fd, msg);
  std::string got;
  Packet p;
  while (got.size() < 1000 && g.next_op(kOpRw, &p, 1000)) got += p.data;
  CHECK_EQ(got.size(), size_t{1000});
  CHECK(!g.next_op(kOpRw, &p, 50));  // no credit left: nothing more
  g.fwd_cnt = 1000;
  g.send(g.hdr(kOpCreditUpdate, 5000 + 1, hp));
  while (got.size() < 2000 && g.next_op(kOpRw, &p, 1000)) got += p.data;
  CHECK_EQ(got.size(), size_t{2000});
  CHECK(!g.next_op(kOpRw, &p, 50));
  g.fwd_cnt = 2000;  // all it got so far, consumed
  g.buf_alloc = 4096;
  g.send(g.hdr(kOpCreditUpdate, 5001, hp));
  while (got.size() < 3000 && g.next_op(kOpRw, &p, 1000)) got += p.data;
  CHECK(got == msg);
  // CREDIT_REQUEST is answered with our counters.
  g.send(g.hdr(kOpCreditRequest, 5001, hp));
  CHECK(g.next_op(kOpCreditUpdate, &p));
  CHECK_EQ(p.h.buf_alloc, Connection::kDefaultBufAlloc);
  close(fd);
}

TEST("vsock device: guest -> host with a slow reader: EPOLLOUT resumes, credit updates flow") {
  Guest g;
  uint32_t hp = 0;
  int fd = g.establish(5002, &hp);
  const size_t total = 2 << 20;  // far more than buf_alloc plus the socket buffer
  std::string msg = pattern(total, 3);
  std::string received;
  std::atomic<bool> stop{false};
  std::thread reader([&] {
    std::this_thread::sleep_for(Ms(100));  // let the device fill its buffer first
    received = read_n(fd, total, 20000);
    stop = true;
  });
  uint32_t host_buf = 0, host_fwd = 0;
  Packet p;
  CHECK(!g.next_op(kOpRw, &p, 0));
  size_t sent = 0;
  bool was_blocked = false;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  host_buf = Connection::kDefaultBufAlloc;  // from the REQUEST header
  while (sent < total && std::chrono::steady_clock::now() < end) {
    g.collect();
    for (auto& q : g.inbox) {
      if (q.h.op == kOpCreditUpdate || q.h.op == kOpRw) {
        host_buf = q.h.buf_alloc;
        host_fwd = q.h.fwd_cnt;
      }
    }
    g.inbox.clear();
    uint32_t in_flight = static_cast<uint32_t>(sent) - host_fwd;
    uint32_t credit = in_flight >= host_buf ? 0 : host_buf - in_flight;
    size_t n = std::min<size_t>({credit, 4096 * 8, total - sent});
    if (n == 0) {
      was_blocked = true;
      std::this_thread::sleep_for(Ms(1));
      continue;
    }
    g.send(g.hdr(kOpRw, 5002, hp, static_cast<uint32_t>(n)), msg.substr(sent, n));
    sent += n;
  }
  reader.join();
  CHECK_EQ(sent, total);
  CHECK(was_blocked);  // the credit limit really bit
  CHECK(received == msg);
  VsockStats s = g.stats();
  CHECK_EQ(s.rst_sent, uint64_t{0});
  close(fd);
}

TEST("vsock device: a guest sending past its credit is reset") {
  Guest g;
  uint32_t hp = 0;
  int fd = g.establish(5003, &hp);
  std::string chunk = pattern(kMaxPayload);
  Packet p;
  bool reset = false;
  for (int i = 0; i < 40 && !reset; i++) {
    g.send(g.hdr(kOpRw, 5003, hp, kMaxPayload), chunk);
    g.collect();
    for (auto& q : g.inbox) reset = reset || q.h.op == kOpRst;
  }
  CHECK(reset);
  CHECK(sees_eof(fd, 3000));
  CHECK_EQ(g.stats().live, uint64_t{0});
  close(fd);
}

TEST("vsock device: RST for unknown connections; malformed packets dropped") {
  Guest g;
  Packet p;
  g.send(g.hdr(kOpRw, 1234, 7777, 2), "hi");
  CHECK(g.next_op(kOpRst, &p));
  CHECK_EQ(p.h.src_port, 7777u);
  CHECK_EQ(p.h.dst_port, 1234u);
  CHECK_EQ(p.h.dst_cid, kCid);
  g.send(g.hdr(kOpRequest, 1235, 22));  // guest-initiated: we listen on nothing
  CHECK(g.next_op(kOpRst, &p));
  CHECK_EQ(p.h.dst_port, 1235u);
  g.send(g.hdr(kOpRst, 1236, 7777));  // never answer RST with RST
  CHECK(!g.next_op(kOpRst, &p, 30));

  Header bad = g.hdr(kOpRw, 1, 2, 0);
  bad.src_cid = 4;
  g.send(bad);
  bad = g.hdr(kOpRw, 1, 2, 0);
  bad.dst_cid = 9;
  g.send(bad);
  bad = g.hdr(kOpRw, 1, 2, 0);
  bad.type = 2;
  g.send(bad);
  g.send(g.hdr(9, 1, 2));                              // unknown op
  g.send(g.hdr(kOpRw, 1, 2, 100), "0123456789", 54);   // len beyond the chain
  g.send(g.hdr(kOpRw, 1, 2, 70000), "", 44);           // oversized
  g.send(g.hdr(kOpShutdown, 1, 2, 3), "abc");          // payload on a control op
  g.send(g.hdr(kOpRw, 1, 2), "", 20);                  // shorter than a header
  CHECK(!g.next_op(kOpRst, &p, 30));
  VsockStats s = g.stats();
  CHECK_EQ(s.dropped, uint64_t{8});
  CHECK_EQ(g.status() & virtio::kStatusNeedsReset, 0u);
  // Still serving.
  uint32_t hp;
  int fd = g.establish(5004, &hp);
  CHECK(fd >= 0);
  close(fd);
}

TEST("vsock device: a guest REQUEST to a knock port is counted, reported once per burst, answered RST") {
  Guest g;
  std::mutex m;
  std::condition_variable cv;
  int reports = 0;
  g.host->set_knock_ports({1023}, [&] {
    std::lock_guard<std::mutex> lock(m);
    reports++;
    cv.notify_all();
  });
  auto count = [&] {
    auto k = g.host->knocks();
    return k.size() == 1 && k[0].first == 1023 ? k[0].second : ~uint64_t{0};
  };
  CHECK_EQ(count(), uint64_t{0});
  Packet p;
  g.send(g.hdr(kOpRequest, 5000, 1023));
  CHECK(g.next_op(kOpRst, &p));
  CHECK_EQ(p.h.src_port, 1023u);
  CHECK_EQ(p.h.dst_port, 5000u);
  CHECK_EQ(p.h.dst_cid, kCid);
  {
    std::unique_lock<std::mutex> lock(m);
    CHECK(cv.wait_for(lock, Ms(2000), [&] { return reports == 1; }));
  }
  CHECK_EQ(count(), uint64_t{1});

  // Not a knock: another port, or another op on the knock port.
  g.send(g.hdr(kOpRequest, 5001, 22));
  CHECK(g.next_op(kOpRst, &p));
  g.send(g.hdr(kOpRw, 5002, 1023, 2), "hi");
  CHECK(g.next_op(kOpRst, &p));
  CHECK_EQ(count(), uint64_t{1});

  // A guest knocking in a loop: every knock counted and answered, the reports
  // coalesced (never more than the knocks), the last one after the last knock.
  constexpr int kBurst = 600;
  for (int i = 0; i < kBurst; i++) {
    g.send(g.hdr(kOpRequest, 6000 + i, 1023));
    if (i % 16 == 15) g.collect();
  }
  int rsts = 0;
  while (rsts < kBurst && g.next_op(kOpRst, nullptr, 2000)) rsts++;
  CHECK_EQ(rsts, kBurst);
  CHECK_EQ(count(), uint64_t{kBurst + 1});
  CHECK_EQ(g.stats().knocks, uint64_t{kBurst + 1});
  {
    std::unique_lock<std::mutex> lock(m);
    CHECK(cv.wait_for(lock, Ms(2000), [&] { return reports >= 2; }));
    CHECK(reports <= kBurst + 1);
  }
  std::this_thread::sleep_for(Ms(20));
  std::printf("  knocks: %d in a burst -> %d reports\n", kBurst, reports - 1);

  // Ranges are lib's to check; the device asserts them (an internal error, never an abort).
  CHECK_THROWS_CODE(g.host->set_knock_ports({1024}, nullptr), "INTERNAL");
  CHECK_THROWS_CODE(g.host->set_knock_ports({0}, nullptr), "INTERNAL");
  CHECK_EQ(g.status() & virtio::kStatusNeedsReset, 0u);
}

TEST("vsock device: refused, timed out, and a malformed packet on a live connection") {
  Guest g;
  auto r = g.connect(6000);
  Packet req;
  CHECK(g.next_op(kOpRequest, &req));
  g.send(g.hdr(kOpRst, 6000, req.h.src_port));
  CHECK(r->wait(2000));
  CHECK_EQ(r->fd, -1);
  CHECK(r->code == "VSOCK_REFUSED");

  auto t = g.connect(6001, 50);
  CHECK(g.next_op(kOpRequest, &req));
  CHECK(t->wait(2000));
  CHECK(t->code == "TIMEOUT");
  Packet rst;
  CHECK(g.next_op(kOpRst, &rst));  // so the guest forgets the request
  CHECK_EQ(rst.h.dst_port, 6001u);
  // A late RESPONSE is answered with RST.
  g.send(g.hdr(kOpResponse, 6001, req.h.src_port));
  CHECK(g.next_op(kOpRst, &rst));

  uint32_t hp;
  int fd = g.establish(6002, &hp);
  g.send(g.hdr(kOpRw, 6002, hp, 100), "short", 49);
  CHECK(g.next_op(kOpRst, &rst));
  CHECK(sees_eof(fd));
  close(fd);
  CHECK_EQ(g.stats().live, uint64_t{0});
}

// arm_timer skips the system call when the earliest deadline did not move: kicks in between
// must not lose the timer, and a pause that outlives a deadline must still fire it on resume.
TEST("vsock device: a connect timeout fires through guest kicks, and on resume after a pause that outlived it") {
  Guest g;
  auto t = g.connect(6001, 100);
  Packet req;
  CHECK(g.next_op(kOpRequest, &req));
  for (int i = 0; i < 5; i++) {
    g.dev->notify(VsockDevice::kRxQueue);
    std::this_thread::sleep_for(Ms(10));
  }
  CHECK(t->wait(2000));
  CHECK(t->code == "TIMEOUT");

  auto u = g.connect(6003, 100);
  CHECK(g.next_op(kOpRequest, &req));
  g.dev->quiesce();
  std::this_thread::sleep_for(Ms(300));
  CHECK(!u->wait(0));  // paused: the timer is stopped
  g.dev->unquiesce();
  CHECK(u->wait(2000));
  CHECK(u->code == "TIMEOUT");
}

TEST("vsock device: host close -> SHUTDOWN, then RST on the guest's RST or after the timeout") {
  Guest g;
  uint32_t hp;
  int fd = g.establish(7000, &hp);
  close(fd);
  Packet p;
  CHECK(g.next_op(kOpShutdown, &p, 500));
  CHECK_EQ(p.h.flags, kShutdownBoth);
  g.send(g.hdr(kOpRst, 7000, hp));
  auto end = std::chrono::steady_clock::now() + Ms(1000);
  while (g.stats().live && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(Ms(1));
  CHECK_EQ(g.stats().live, uint64_t{0});

  fd = g.establish(7001, &hp);
  close(fd);
  CHECK(g.next_op(kOpShutdown, &p, 500));  // at once, not at the close timeout
  CHECK(g.next_op(kOpRst, &p, VsockDevice::kCloseTimeoutMs + 1000));  // the guest never answered
  CHECK_EQ(p.h.dst_port, 7001u);
  CHECK_EQ(g.stats().live, uint64_t{0});

  // Half close: the host stops sending but still reads.
  fd = g.establish(7002, &hp);
  shutdown(fd, SHUT_WR);
  CHECK(g.next_op(kOpShutdown, &p));
  CHECK_EQ(p.h.flags, kShutdownSend);
  g.send(g.hdr(kOpRw, 7002, hp, 5), "reply");
  CHECK(read_n(fd, 5) == "reply");
  close(fd);
}

TEST("vsock device: guest SHUTDOWN -> host reads the rest, then EOF; RST ends it") {
  Guest g;
  uint32_t hp;
  int fd = g.establish(7100, &hp);
  g.send(g.hdr(kOpRw, 7100, hp, 3), "bye");
  g.send(g.hdr(kOpShutdown, 7100, hp, 0, kShutdownBoth));
  CHECK(read_n(fd, 3) == "bye");
  CHECK(sees_eof(fd));
  Packet p;
  CHECK(g.next_op(kOpRst, &p));
  CHECK_EQ(p.h.dst_port, 7100u);
  close(fd);
}

TEST("vsock device: transport reset drops connections, then holds REQUESTs until the event buffer is re-posted") {
  Guest g(true, 2);
  uint32_t hp1, hp2;
  int a = g.establish(8000, &hp1);
  int b = g.establish(8001, &hp2);
  g.host->transport_reset();
  auto end = std::chrono::steady_clock::now() + Ms(1000);
  while (g.events_used() == 0 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(Ms(1));
  CHECK_EQ(g.events_used(), uint16_t{1});
  CHECK_EQ(g.event_id(0), kEventTransportReset);
  CHECK(sees_eof(a));
  CHECK(sees_eof(b));
  CHECK_EQ(g.stats().live, uint64_t{0});
  CHECK_EQ(g.stats().events, uint64_t{1});

  auto r = g.connect(8002);
  Packet p;
  CHECK(!g.next_op(kOpRequest, &p, 40));  // held: the guest is still resetting
  CHECK_EQ(g.stats().held_requests, uint64_t{1});
  // However long the guest takes: no limit of the device's own lets it through early.
  CHECK(!g.next_op(kOpRequest, &p, 300));
  g.post_event();                        // ...done: it re-posts the buffer
  CHECK(g.next_op(kOpRequest, &p, 1000));
  CHECK_EQ(p.h.dst_port, 8002u);
  g.send(g.hdr(kOpResponse, 8002, p.h.src_port));
  CHECK(r->wait(1000));
  CHECK(r->fd >= 0);
  close(r->fd);
  close(a);
  close(b);
}

TEST("vsock device: a REQUEST made before the driver is up survives its probe reset") {
  FakeRam ram(4 << 20);
  CountingIrq irq;
  EventLoop loop;
  loop.start();
  {
    auto device = std::make_unique<VsockDevice>(ram.mem, loop, kCid);
    VsockDevice& vsock = *device;
    VirtioMmioTransport dev(ram.mem, irq, loop, std::move(device));
    auto r = std::make_shared<ConnectResult>();
    vsock.connect(9000, 2000, [r](int fd, const char* code, const std::string&) {
      std::lock_guard<std::mutex> lock(r->m);
      r->fd = fd;
      r->code = code ? code : "";
      r->done = true;
      r->cv.notify_all();
    });
    std::this_thread::sleep_for(Ms(20));
    uint32_t zero = 0;
    dev.write(mmio::kStatus, reinterpret_cast<uint8_t*>(&zero), 4);  // the driver's first move
    CHECK(!r->wait(20));
    CHECK_EQ(vsock.stats().live, uint64_t{1});
  }  // destroyed with the request pending: done(-1) is posted, nothing leaks
  loop.stop();
}

TEST("vsock device: driver reset closes connections; EVENT_IDX off works; state round trip") {
  Guest g(false);
  uint32_t hp;
  int fd = g.establish(9100, &hp);
  write_all(fd, "x");
  Packet p;
  CHECK(g.next_op(kOpRw, &p));
  g.reg(mmio::kStatus, 0);
  CHECK(sees_eof(fd));
  close(fd);

  StateWriter w;
  g.host->save(w);
  {
    Guest h;
    StateReader r(w.data());
    h.host->restore(r);
    CHECK_EQ(r.remaining(), size_t{0});
  }
  // Corrupt: wrong tag, truncated, reserved CID.
  StateWriter bad;
  bad.header("virtio-vsock", 1);
  bad.u64(2);
  bad.u32(2000);
  Guest h;
  StateReader rb(bad.data());
  CHECK_THROWS_CODE(h.host->restore(rb), "SNAPSHOT_INVALID");
  for (size_t n = 0; n < w.data().size(); n++) {
    StateReader t(w.data().data(), n);
    CHECK_THROWS_CODE(h.host->restore(t), "SNAPSHOT_INVALID");
  }
  // The whole transport too (queues + device), into a fresh machine.
  StateWriter tw;
  h.dev->save(tw);
  Guest k;
  StateReader tr(tw.data());
  k.dev->restore(tr);
  CHECK_EQ(k.status() & 0x0f, 0x0fu);
}

TEST("vsock device: host -> guest bulk on two connections at once, guest paced by credit updates") {
  Guest g;
  g.buf_alloc = 128 * 1024;
  uint32_t hp[2];
  int fd[2];
  fd[0] = g.establish(9200, &hp[0]);
  fd[1] = g.establish(9201, &hp[1]);
  const size_t total = 1 << 20;
  std::string msg[2] = {pattern(total, 1), pattern(total, 2)};
  std::thread writers[2];
  for (int i = 0; i < 2; i++) writers[i] = std::thread([&, i] { write_all(fd[i], msg[i]); });
  std::string got[2];
  uint32_t reported[2] = {0, 0};
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((got[0].size() < total || got[1].size() < total) && std::chrono::steady_clock::now() < end) {
    g.collect();
    for (auto& p : g.inbox) {
      if (p.h.op != kOpRw) continue;
      int i = p.h.src_port == hp[0] ? 0 : 1;
      got[i] += p.data;
    }
    g.inbox.clear();
    for (int i = 0; i < 2; i++) {
      uint32_t consumed = static_cast<uint32_t>(got[i].size());
      if (consumed - reported[i] >= 32 * 1024) {  // the guest "read" it: give credit back
        g.fwd_cnt = consumed;
        g.send(g.hdr(kOpCreditUpdate, 9200 + i, hp[i]));
        reported[i] = consumed;
      }
    }
    std::this_thread::sleep_for(Ms(1));
  }
  for (auto& w : writers) w.join();
  CHECK(got[0] == msg[0]);
  CHECK(got[1] == msg[1]);
  close(fd[0]);
  close(fd[1]);
}

TEST("vsock device: echo round trips through the device (bench)") {
  Guest g;
  uint32_t hp;
  int fd = g.establish(9300, &hp);
  const int rounds = 1000;
  std::string msg(64, 'e');
  char buf[128];
  uint32_t consumed = 0;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; i++) {
    write_all(fd, msg);
    std::string got;
    // The guest side busy-polls its rx ring and echoes what it gets.
    while (got.size() < msg.size()) {
      g.collect();
      for (auto& p : g.inbox)
        if (p.h.op == kOpRw) got += p.data;
      g.inbox.clear();
    }
    consumed += static_cast<uint32_t>(got.size());
    g.fwd_cnt = consumed;
    g.send(g.hdr(kOpRw, 9300, hp, static_cast<uint32_t>(got.size())), got);
    size_t n = 0;
    while (n < msg.size()) {
      ssize_t r = read(fd, buf, sizeof buf);
      if (r > 0) n += static_cast<size_t>(r);
    }
  }
  double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / rounds;
  std::printf("  bench: vsock echo round trip (host socket -> device -> mock guest -> device -> host socket): %.1f us "
              "(%d rounds, %s)\n", us, rounds, torpor_test::kBuildKind);
  CHECK(g.stats().rst_sent == 0);
  close(fd);
}
