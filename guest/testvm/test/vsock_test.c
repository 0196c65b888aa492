/* The vsock driver and the protocol responder of the test guest, run on the host
 * against a fake virtio-vsock device: the host end of every connection is played
 * here, with its own credit accounting, so echo, flow control, RST rules, transport
 * reset and the agent protocol are checked without a VM. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_device.h"
#include "frame.h"
#include "responder.h"
#include "status.h"
#include "virtio.h"
#include "vsock.h"

const char *last_result_line(void);

#define GUEST_CID 3
#define HOST_CID 2
enum { OP_REQUEST = 1, OP_RESPONSE, OP_RST, OP_SHUTDOWN, OP_RW, OP_CREDIT_UPDATE, OP_CREDIT_REQUEST };

struct hdr {
  uint64_t src_cid, dst_cid;
  uint32_t src_port, dst_port, len;
  uint16_t type, op;
  uint32_t flags, buf_alloc, fwd_cnt;
} __attribute__((packed));

static int failures;
#define CHECK(cond, ...)                                 \
  do {                                                   \
    if (!(cond)) {                                       \
      failures++;                                        \
      printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      printf(__VA_ARGS__);                               \
      printf("\n");                                      \
    }                                                    \
  } while (0)

/* The host end of one connection. */
struct host_conn {
  uint32_t host_port, guest_port;
  int connected, reset;
  uint32_t buf_alloc;      /* what the host can hold */
  uint32_t fwd_cnt;        /* bytes the host consumed */
  uint32_t rx_unread;      /* received, not yet consumed */
  uint32_t tx_cnt;         /* bytes the host sent */
  uint32_t guest_buf_alloc, guest_fwd_cnt;
  uint8_t *received;
  size_t received_len, received_cap;
  int credit_requests;
};

#define MAX_HOST_CONNS 4
static struct host_conn *hconns[MAX_HOST_CONNS];
static int unknown_rsts; /* RSTs for no known connection */
static int knocks_seen;  /* guest-initiated REQUESTs */
static uint32_t last_knock_port;
static int credit_violations;
static struct virtio_dev dev;

static struct host_conn *by_port(uint32_t host_port) {
  for (int i = 0; i < MAX_HOST_CONNS; i++)
    if (hconns[i] && hconns[i]->host_port == host_port) return hconns[i];
  return 0;
}

static void host_send(struct host_conn *c, uint16_t op, const void *data, uint32_t len, uint32_t flags) {
  uint8_t pkt[sizeof(struct hdr) + 65536];
  struct hdr h = {HOST_CID, GUEST_CID, c->host_port, c->guest_port, len, 1, op, flags, c->buf_alloc, c->fwd_cnt};
  memcpy(pkt, &h, sizeof h);
  if (len) memcpy(pkt + sizeof h, data, len);
  int head = fake_pop(0, 0, 0, 0);
  if (head < 0) {
    printf("FAIL no rx buffer posted by the guest\n");
    failures++;
    return;
  }
  fake_complete(0, head, pkt, sizeof h + len);
  if (op == OP_RW) c->tx_cnt += len;
}

static void host_send_raw(const struct hdr *h) {
  int head = fake_pop(0, 0, 0, 0);
  if (head >= 0) fake_complete(0, head, (const uint8_t *)h, sizeof *h);
}

/* Runs the driver, then handles everything the guest sent. */
void test_device_step(void);
void test_device_step(void) {
  uint8_t pkt[sizeof(struct hdr) + 65536];
  size_t n;
  int head;
  while ((head = fake_pop(1, pkt, sizeof pkt, &n)) >= 0) {
    fake_complete(1, head, 0, 0);
    struct hdr h;
    if (n < sizeof h) {
      failures++;
      printf("FAIL short tx packet\n");
      continue;
    }
    memcpy(&h, pkt, sizeof h);
    CHECK(h.src_cid == GUEST_CID && h.dst_cid == HOST_CID && h.type == 1, "addressing");
    if (h.op == OP_REQUEST) { /* guest-initiated: a knock; the host refuses it as ours does */
      knocks_seen++;
      last_knock_port = h.dst_port;
      struct hdr rst = {HOST_CID, GUEST_CID, h.dst_port, h.src_port, 0, 1, OP_RST, 0, 0, 0};
      host_send_raw(&rst);
      continue;
    }
    struct host_conn *c = by_port(h.dst_port);
    if (!c || (c->reset && h.op != OP_RST)) {
      if (h.op == OP_RST) unknown_rsts++;
      continue;
    }
    c->guest_buf_alloc = h.buf_alloc;
    c->guest_fwd_cnt = h.fwd_cnt;
    switch (h.op) {
      case OP_RESPONSE: c->connected = 1; break;
      case OP_RST: c->reset = 1; c->connected = 0; break;
      case OP_CREDIT_REQUEST: c->credit_requests++; host_send(c, OP_CREDIT_UPDATE, 0, 0, 0); break;
      case OP_RW:
        CHECK(n - sizeof h == h.len, "payload length %zu vs %u", n - sizeof h, h.len);
        if (c->rx_unread + h.len > c->buf_alloc) credit_violations++;
        c->rx_unread += h.len;
        if (c->received_len + h.len > c->received_cap) {
          c->received_cap = (c->received_len + h.len) * 2;
          c->received = realloc(c->received, c->received_cap);
        }
        memcpy(c->received + c->received_len, pkt + sizeof h, h.len);
        c->received_len += h.len;
        break;
    }
  }
}

static void run(int rounds) {
  for (int i = 0; i < rounds; i++) {
    vsock_poll();
    test_device_step();
  }
}

/* The host reads what arrived and tells the guest. */
static void host_consume(struct host_conn *c) {
  if (!c->rx_unread) return;
  c->fwd_cnt += c->rx_unread;
  c->rx_unread = 0;
  host_send(c, OP_CREDIT_UPDATE, 0, 0, 0);
}

static uint32_t guest_window(struct host_conn *c) {
  uint32_t in_flight = c->tx_cnt - c->guest_fwd_cnt;
  return in_flight >= c->guest_buf_alloc ? 0 : c->guest_buf_alloc - in_flight;
}

static struct host_conn *host_connect(uint32_t host_port, uint32_t guest_port, uint32_t buf_alloc) {
  struct host_conn *c = calloc(1, sizeof *c);
  c->host_port = host_port;
  c->guest_port = guest_port;
  c->buf_alloc = buf_alloc;
  for (int i = 0; i < MAX_HOST_CONNS; i++)
    if (!hconns[i]) {
      hconns[i] = c;
      break;
    }
  host_send(c, OP_REQUEST, 0, 0, 0);
  run(3);
  return c;
}

static void host_forget(struct host_conn *c) {
  for (int i = 0; i < MAX_HOST_CONNS; i++)
    if (hconns[i] == c) hconns[i] = 0;
  free(c->received);
  free(c);
}

static void test_knock(void) {
  printf("knock: a REQUEST to the host's port 1023, the host's RST left unanswered\n");
  int before = knocks_seen, rsts = unknown_rsts;
  vsock_knock();
  run(3);
  CHECK(knocks_seen == before + 1, "one knock, saw %d", knocks_seen - before);
  CHECK(last_knock_port == VSOCK_KNOCK_PORT, "knock port %u", last_knock_port);
  CHECK(unknown_rsts == rsts, "the guest answered the host's RST");
  /* still serving */
  struct host_conn *c = host_connect(5100, 7, 65536);
  CHECK(c->connected, "echo port accepts after a knock");
  host_send(c, OP_SHUTDOWN, 0, 0, 3);
  run(3);
  host_forget(c);
}

static void test_echo_and_rst_rules(void) {
  printf("echo port, refused port, unknown connection\n");
  struct host_conn *c = host_connect(5000, 7, 65536);
  CHECK(c->connected, "echo port accepts");
  CHECK(c->guest_buf_alloc == 64 * 1024, "guest window %u", c->guest_buf_alloc);
  host_send(c, OP_RW, "hello", 5, 0);
  run(3);
  CHECK(c->received_len == 5 && memcmp(c->received, "hello", 5) == 0, "echoed %zu bytes", c->received_len);
  CHECK(c->guest_fwd_cnt == 5, "guest consumed 5, says %u", c->guest_fwd_cnt);

  struct host_conn *refused = host_connect(5001, 9, 65536);
  CHECK(!refused->connected && refused->reset, "port 9 answers RST");
  host_forget(refused);

  /* a data packet for a connection the guest never saw */
  int before = unknown_rsts;
  struct hdr h = {HOST_CID, GUEST_CID, 5999, 7, 0, 1, OP_RW, 0, 65536, 0};
  host_send_raw(&h);
  run(3);
  CHECK(unknown_rsts == before + 1, "RST for an unknown connection");
  /* and never a RST in answer to a RST */
  h.op = OP_RST;
  host_send_raw(&h);
  run(3);
  CHECK(unknown_rsts == before + 1, "no RST for a RST");

  host_send(c, OP_SHUTDOWN, 0, 0, 3);
  run(3);
  CHECK(c->reset, "SHUTDOWN -> RST");
  host_forget(c);
}

/* 1 MiB through a host that holds only 8 KiB and reads it late: the guest must stay
 * inside the host's window, and the host inside the guest's. */
static void test_bulk_with_flow_control(void) {
  printf("1 MiB echo with an 8 KiB host window\n");
  struct host_conn *c = host_connect(5002, 7, 8192);
  CHECK(c->connected, "connected");
  const size_t total = 1 << 20;
  uint8_t *data = malloc(total);
  for (size_t i = 0; i < total; i++) data[i] = (uint8_t)(i * 7 + (i >> 11));
  size_t sent = 0;
  for (int round = 0; round < 200000 && c->received_len < total; round++) {
    uint32_t w = guest_window(c);
    if (sent < total && w > 0) {
      uint32_t n = w < 3000 ? w : 3000; /* odd size: packets straddle */
      if (n > total - sent) n = (uint32_t)(total - sent);
      if (fake_available(0)) {
        host_send(c, OP_RW, data + sent, n, 0);
        sent += n;
      }
    }
    run(1);
    if (round % 3 == 0) host_consume(c);
  }
  host_consume(c);
  CHECK(c->received_len == total, "echoed %zu of %zu", c->received_len, total);
  CHECK(c->received_len == total && memcmp(c->received, data, total) == 0, "bytes identical");
  CHECK(credit_violations == 0, "guest overran the host window %d times", credit_violations);
  free(data);
  host_send(c, OP_RST, 0, 0, 0);
  run(2);
  host_forget(c);
}

static size_t frame(uint8_t *buf, uint32_t stream, uint16_t type, uint64_t request_id, const char *data, size_t data_len) {
  struct tp_writer w;
  tp_writer_init(&w, buf, 65536);
  tp_writer_frame(&w, stream, type, 0);
  if (type == TP_HELLO) {
    tp_put_u32(&w, TP_T_VERSION, (uint32_t)request_id);
    tp_put_u64(&w, TP_T_FEATURES, 0x3f);
    tp_put_str(&w, TP_T_NAME, "vsock_test");
  } else if (type == TP_PING) {
    tp_put_bytes(&w, TP_T_NONCE, data, data_len);
  } else {
    tp_put_u64(&w, TP_T_REQUEST_ID, request_id);
    if (data) tp_put_bytes(&w, TP_T_DATA, data, data_len);
  }
  return tp_writer_finish(&w);
}

/* Reads the frames the guest sent so far, from *pos on. */
static int next_frame(struct host_conn *c, size_t *pos, struct tp_header *h, const uint8_t **payload) {
  if (tp_header_decode(c->received + *pos, c->received_len - *pos, h) != TP_OK_) return 0;
  if (c->received_len - *pos < TP_FRAME_HEADER_SIZE + h->length) return 0;
  *payload = c->received + *pos + TP_FRAME_HEADER_SIZE;
  *pos += TP_FRAME_HEADER_SIZE + h->length;
  return 1;
}

static int field_bytes(const uint8_t *payload, uint32_t len, uint16_t tag, const uint8_t **v, uint32_t *vlen) {
  struct tp_reader r;
  struct tp_field f;
  tp_reader_init(&r, payload, len);
  while (tp_reader_next(&r, &f) == TP_OK_)
    if (f.tag == tag) {
      *v = f.value;
      *vlen = f.len;
      return 1;
    }
  return 0;
}

static void test_agent_protocol(void) {
  printf("agent port: HELLO, PING, ECHO, re-asked id, SYNC, RESUMED, errors\n");
  struct host_conn *c = host_connect(5003, 1024, 1 << 20);
  CHECK(c->connected, "agent port accepts");
  CHECK(c->guest_buf_alloc == 16 * 1024, "agent window %u", c->guest_buf_alloc);
  uint8_t buf[65536];
  size_t pos = 0, n;
  struct tp_header h;
  const uint8_t *p, *v;
  uint32_t vlen;

  n = frame(buf, 0, TP_HELLO, 1, 0, 0);
  host_send(c, OP_RW, buf, (uint32_t)n, 0);
  run(3);
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_HELLO && h.stream == 0, "HELLO answer");
  CHECK(field_bytes(p, h.length, TP_T_NAME, &v, &vlen) && vlen == 15 && memcmp(v, "torpor-testvm 1", 15) == 0, "name");

  n = frame(buf, 0, TP_PING, 0, "nonce-123", 9);
  host_send(c, OP_RW, buf, (uint32_t)n, 0);
  run(3);
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_PONG, "PONG");
  CHECK(field_bytes(p, h.length, TP_T_NONCE, &v, &vlen) && vlen == 9 && memcmp(v, "nonce-123", 9) == 0, "nonce back");

  /* two frames in one packet, the second split across two packets */
  size_t a = frame(buf, 1, TP_ECHO, 0x1111, "first", 5);
  size_t b = frame(buf + a, 3, TP_ECHO, 0x2222, "second", 6);
  host_send(c, OP_RW, buf, (uint32_t)(a + 4), 0);
  host_send(c, OP_RW, buf + a + 4, (uint32_t)(b - 4), 0);
  run(3);
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_OK && h.stream == 1 && (h.flags & TP_FLAG_END), "OK on 1");
  CHECK(field_bytes(p, h.length, TP_T_DATA, &v, &vlen) && vlen == 5 && memcmp(v, "first", 5) == 0, "data first");
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_OK && h.stream == 3, "OK on 3");
  CHECK(field_bytes(p, h.length, TP_T_DATA, &v, &vlen) && vlen == 6 && memcmp(v, "second", 6) == 0, "data second");

  /* re-asked id on a new stream with other data: the remembered answer comes back */
  uint32_t replays = responder_stats.replays;
  n = frame(buf, 5, TP_ECHO, 0x1111, "other", 5);
  host_send(c, OP_RW, buf, (uint32_t)n, 0);
  run(3);
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_OK && h.stream == 5, "replayed answer on stream 5");
  CHECK(field_bytes(p, h.length, TP_T_DATA, &v, &vlen) && vlen == 5 && memcmp(v, "first", 5) == 0, "same answer");
  CHECK(responder_stats.replays == replays + 1, "replay counted");

  /* SYNC and RESUMED: answered OK, counted in the status page, RESUMED's fields kept */
  uint32_t syncs = status_page.syncs, resumed = status_page.resumed;
  n = frame(buf, 13, TP_SYNC, 0x6666, 0, 0);
  host_send(c, OP_RW, buf, (uint32_t)n, 0);
  run(3);
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_OK && h.stream == 13 && (h.flags & TP_FLAG_END), "SYNC -> OK");
  CHECK(status_page.syncs == syncs + 1, "SYNC counted");
  {
    struct tp_writer rw;
    static const uint8_t entropy[32] = {0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99};
    tp_writer_init(&rw, buf, sizeof buf);
    tp_writer_frame(&rw, 15, TP_RESUMED, 0);
    tp_put_u64(&rw, TP_T_REQUEST_ID, 0x7777);
    tp_put_i64(&rw, TP_T_TIME_NS, 1764612345123456789ll);
    tp_put_bytes(&rw, TP_T_ENTROPY, entropy, sizeof entropy);
    n = tp_writer_finish(&rw);
    host_send(c, OP_RW, buf, (uint32_t)n, 0);
    /* asked again under the same id: answered from memory, counted once */
    tp_writer_init(&rw, buf, sizeof buf);
    tp_writer_frame(&rw, 17, TP_RESUMED, 0);
    tp_put_u64(&rw, TP_T_REQUEST_ID, 0x7777);
    tp_put_i64(&rw, TP_T_TIME_NS, 1);
    n = tp_writer_finish(&rw);
    host_send(c, OP_RW, buf, (uint32_t)n, 0);
  }
  run(3);
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_OK && h.stream == 15, "RESUMED -> OK");
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_OK && h.stream == 17, "re-asked RESUMED -> OK");
  CHECK(status_page.resumed == resumed + 1, "RESUMED counted once");
  CHECK(status_page.resumed_time_ns == 1764612345123456789ull, "RESUMED time kept");
  CHECK(status_page.resumed_entropy_len == 32 && status_page.resumed_entropy_head == 0x8877665544332211ull, "entropy head kept");

  /* a request the test guest does not serve, and an unknown type */
  n = frame(buf, 7, TP_EXEC, 0x3333, 0, 0);
  host_send(c, OP_RW, buf, (uint32_t)n, 0);
  n = frame(buf, 9, 200, 0x4444, 0, 0);
  host_send(c, OP_RW, buf, (uint32_t)n, 0);
  run(3);
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_ERR && h.stream == 7 && h.flags == (TP_FLAG_END | TP_FLAG_ERROR), "ERR 7");
  CHECK(field_bytes(p, h.length, TP_T_CODE, &v, &vlen) && vlen == 14 && memcmp(v, "REQUEST_FAILED", 14) == 0, "code");
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_ERR && h.stream == 9, "ERR 9");
  CHECK(field_bytes(p, h.length, TP_T_CODE, &v, &vlen) && vlen == 14 && memcmp(v, "PROTOCOL_ERROR", 14) == 0, "code");

  /* a 40 KiB ECHO (more than the guest buffers): ERR, then the connection goes on */
  static char big[40 * 1024];
  memset(big, 'x', sizeof big);
  uint8_t *bigframe = malloc(sizeof big + 64);
  struct tp_writer w;
  tp_writer_init(&w, bigframe, sizeof big + 64);
  tp_writer_frame(&w, 11, TP_ECHO, 0);
  tp_put_u64(&w, TP_T_REQUEST_ID, 0x5555);
  tp_put_bytes(&w, TP_T_DATA, big, sizeof big);
  size_t bn = tp_writer_finish(&w), off = 0;
  for (int round = 0; round < 10000 && off < bn; round++) {
    uint32_t win = guest_window(c), chunk = win < 4096 ? win : 4096;
    if (chunk > bn - off) chunk = (uint32_t)(bn - off);
    if (chunk && fake_available(0)) {
      host_send(c, OP_RW, bigframe + off, chunk, 0);
      off += chunk;
    }
    run(1);
  }
  free(bigframe);
  CHECK(off == bn, "guest window reopened for the whole oversized frame (%zu of %zu)", off, bn);
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_ERR && h.stream == 11, "ERR for the oversized frame");
  n = frame(buf, 0, TP_PING, 0, "after", 5);
  host_send(c, OP_RW, buf, (uint32_t)n, 0);
  run(3);
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_PONG, "PONG after the oversized frame");

  /* malformed fields: GOAWAY, then RST */
  uint8_t bad[12 + 4] = {4, 0, 0, 0, 13, 0, 0, 0, TP_ECHO, 0, 0, 0, 27, 0, 9, 9};
  host_send(c, OP_RW, bad, sizeof bad, 0);
  run(3);
  CHECK(next_frame(c, &pos, &h, &p) && h.type == TP_GOAWAY, "GOAWAY for malformed fields");
  CHECK(c->reset, "connection reset after GOAWAY");
  host_forget(c);
}

static void test_transport_reset(void) {
  printf("transport reset and reconnect\n");
  struct host_conn *c = host_connect(5004, 7, 65536);
  CHECK(c->connected, "connected");
  int head = fake_pop(2, 0, 0, 0);
  CHECK(head >= 0, "event buffer posted");
  uint32_t reset_event = 0;
  fake_complete(2, head, (const uint8_t *)&reset_event, 4);
  run(3);
  CHECK(fake_available(2) >= 1, "event buffer re-posted");
  /* the old connection is gone in the guest: data for it gets RST */
  c->reset = 0;
  host_send(c, OP_RW, "stale", 5, 0);
  run(3);
  CHECK(c->reset && c->received_len == 0, "stale connection gets RST, no echo");
  host_forget(c);
  struct host_conn *again = host_connect(5005, 7, 65536);
  CHECK(again->connected, "reconnect after transport reset");
  host_send(again, OP_RW, "again", 5, 0);
  run(3);
  CHECK(again->received_len == 5, "echo after reconnect");
  host_send(again, OP_RST, 0, 0, 0);
  run(2);
  host_forget(again);
}

static void test_window_violation(void) {
  printf("data beyond the guest window resets the connection\n");
  /* a host that never lets the guest echo: the guest holds everything it gets */
  struct host_conn *c = host_connect(5006, 7, 0);
  CHECK(c->connected, "connected");
  static uint8_t junk[4096];
  int packets = 0;
  for (; packets < 20 && !c->reset; packets++) {
    host_send(c, OP_RW, junk, sizeof junk, 0);
    run(1);
  }
  CHECK(c->reset && packets == 17, "RST on the packet past 64 KiB (after %d)", packets);
  CHECK(c->credit_requests >= 1, "the guest asked for credit");
  CHECK(c->received_len == 0, "nothing sent into a shut window");
  host_forget(c);
  run(2);
  CHECK(fake_available(0) == 32, "every receive buffer back in the queue (%d)", fake_available(0));
}

/* The host's credit is shut while it sends small packets (legal: well inside the
 * guest's 64 KiB window). A guest that holds one receive buffer per packet runs out
 * of them, and the host's CREDIT_UPDATE that would unblock the echo has no buffer to
 * arrive in: both sides wait for ever. The guest must keep buffers posted. */
static void test_small_packets_keep_rx_buffers(void) {
  printf("small packets under a shut host window leave receive buffers posted\n");
  struct host_conn *c = host_connect(5007, 7, 0);
  CHECK(c->connected, "connected");
  const uint32_t sizes[] = {100, 1500, 7, 4096, 1, 3000};
  static uint8_t data[60 * 1024];
  size_t sent = 0;
  for (int i = 0; sent < sizeof data; i++) {
    uint32_t n = sizes[i % 6];
    if (n > sizeof data - sent) n = (uint32_t)(sizeof data - sent);
    for (uint32_t k = 0; k < n; k++) data[sent + k] = (uint8_t)((sent + k) * 13 + i);
    if (!fake_available(0)) break; /* host_send would fail: counted below */
    host_send(c, OP_RW, data + sent, n, 0);
    sent += n;
    run(1);
  }
  CHECK(sent == sizeof data, "the guest ran out of receive buffers after %zu of %zu bytes", sent, sizeof data);
  CHECK(!c->reset, "no reset: every packet was inside the window");
  CHECK(fake_available(0) >= 32 - 18, "receive buffers still posted: %d", fake_available(0));
  CHECK(c->received_len == 0, "nothing echoed into a shut window");
  /* The host opens its window: the update arrives, the echo runs, buffers come back. */
  c->buf_alloc = 1 << 20;
  host_send(c, OP_CREDIT_UPDATE, 0, 0, 0);
  for (int round = 0; round < 1000 && c->received_len < sent; round++) {
    run(1);
    host_consume(c);
  }
  CHECK(c->received_len == sent && memcmp(c->received, data, sent) == 0, "echoed %zu of %zu bytes, in order", c->received_len, sent);
  host_send(c, OP_RST, 0, 0, 0);
  run(2);
  host_forget(c);
  CHECK(fake_available(0) == 32, "every receive buffer back in the queue (%d)", fake_available(0));
}

int main(void) {
  fake_init(19, (1ull << 32) | (1ull << 29));
  uint64_t cid = GUEST_CID;
  memcpy(fake.config, &cid, 8);
  CHECK(virtio_probe(&dev, FAKE_BASE, 0x1000, 5) == VIRTIO_PROBE_OK, "probe");
  const char *err = vsock_init(&dev, 1);
  CHECK(err == 0, "init: %s", err ? err : "");
  CHECK(fake.status == 0xf, "status DRIVER_OK, got 0x%x", fake.status);
  CHECK(fake.driver_features == ((1ull << 32) | (1ull << 29)), "VERSION_1 + EVENT_IDX negotiated");
  CHECK(fake_available(0) == 32 && fake_available(2) == 2, "rx %d and event %d buffers", fake_available(0), fake_available(2));

  test_echo_and_rst_rules();
  test_knock();
  test_bulk_with_flow_control();
  test_agent_protocol();
  test_transport_reset();
  test_window_violation();
  test_small_packets_keep_rx_buffers();

  vsock_report();
  CHECK(strstr(last_result_line(), "bad_packets=0") != 0, "no bad packets");
  printf(failures ? "vsock_test: %d FAILED\n" : "vsock_test: all passed\n", failures);
  return failures ? 1 : 0;
}
