#include "vsock.h"

#include "lib.h"
#include "responder.h"
#include "serial.h"

#define VSOCK_TYPE_STREAM 1
enum {
  OP_REQUEST = 1,
  OP_RESPONSE = 2,
  OP_RST = 3,
  OP_SHUTDOWN = 4,
  OP_RW = 5,
  OP_CREDIT_UPDATE = 6,
  OP_CREDIT_REQUEST = 7,
};
#define HOST_CID 2
/* Where a knock comes from: a port nothing here listens on (Linux would pick an ephemeral one). */
#define KNOCK_SRC_PORT 49152u
#define EVENT_TRANSPORT_RESET 0
#define VSOCK_SHUTDOWN_RCV 1

#define Q_RX 0
#define Q_TX 1
#define Q_EVENT 2

struct vsock_hdr {
  uint64_t src_cid;
  uint64_t dst_cid;
  uint32_t src_port;
  uint32_t dst_port;
  uint32_t len;
  uint16_t type;
  uint16_t op;
  uint32_t flags;
  uint32_t buf_alloc;
  uint32_t fwd_cnt;
} __attribute__((packed));

_Static_assert(sizeof(struct vsock_hdr) == 44, "virtio_vsock_hdr is 44 bytes");

/* Receive buffers: header and data as two descriptors (the layout Linux 6.1 posts).
 * An echo connection sends the received data straight back from its buffer, so a
 * buffer stays out of the rx queue until every tx packet pointing into it is done. */
#define RX_BUFS 32
#define RX_DATA 4096u
struct rx_buf {
  struct vsock_hdr hdr;
  uint8_t data[RX_DATA];
  uint32_t len;   /* payload bytes held */
  uint32_t off;   /* payload bytes already handed to tx */
  int16_t next;   /* echo queue link */
  uint8_t refs;   /* tx packets in flight pointing into data */
  uint8_t queued; /* waiting in a connection's echo queue */
};
static struct rx_buf rx_bufs[RX_BUFS];

#define TX_SLOTS 32
#define TX_CHUNK 4096u
struct tx_slot {
  struct vsock_hdr hdr;
  uint8_t busy;
  int8_t conn;
  uint16_t gen;
  int16_t rx;           /* rx buffer the data lies in, or -1 */
  uint32_t agent_bytes; /* bytes of the connection's responder output */
};
static struct tx_slot tx_slots[TX_SLOTS];

#define MAX_CONNS 8
#define ECHO_BUF_ALLOC (64u * 1024u)
enum { CONN_FREE = 0, CONN_OPEN = 1 };
struct conn {
  uint8_t state;
  uint8_t agent; /* 1: protocol responder on the agent port; 0: echo */
  uint8_t credit_asked;
  uint8_t peer_done; /* the peer sends no more: close once our data is out */
  uint16_t gen;
  uint64_t peer_cid;
  uint32_t peer_port;
  uint32_t local_port;
  uint32_t peer_buf_alloc;
  uint32_t peer_fwd_cnt;
  uint32_t tx_cnt;   /* payload bytes we sent */
  uint32_t rx_cnt;   /* payload bytes we received */
  uint32_t fwd_cnt;  /* payload bytes we consumed */
  uint32_t fwd_told; /* fwd_cnt as the peer last heard it */
  uint32_t buf_alloc;
  int16_t echo_head, echo_tail;
};
static struct conn conns[MAX_CONNS];
static struct responder responders[MAX_CONNS];

static struct {
  uint32_t event;
} events[2];

static struct virtio_dev *dev;
static uint64_t guest_cid;
static int kick_rx, kick_tx, kick_event;
static int stalled;

static struct {
  uint32_t accepted, refused, transport_resets, rst_sent, rst_received, rx_packets, tx_packets, bad_packets;
  uint32_t echo_bytes, violations, peer_closed, knocks;
} st;

static int post_rx(struct rx_buf *b) {
  b->len = b->off = 0;
  b->refs = 0;
  b->queued = 0;
  b->next = -1;
  struct vq_buf bufs[2] = {{&b->hdr, sizeof b->hdr, 1}, {b->data, RX_DATA, 1}};
  if (vq_add(&dev->vq[Q_RX], bufs, 2, b) < 0) return 0;
  kick_rx = 1;
  return 1;
}

static void post_event(int i) {
  struct vq_buf buf = {&events[i], sizeof events[i], 1};
  if (vq_add(&dev->vq[Q_EVENT], &buf, 1, &events[i]) >= 0) kick_event = 1;
}

static uint32_t peer_credit(const struct conn *c) {
  uint32_t in_flight = c->tx_cnt - c->peer_fwd_cnt;
  return in_flight >= c->peer_buf_alloc ? 0 : c->peer_buf_alloc - in_flight;
}

static void drain_tx(void);

static struct tx_slot *tx_slot_get(void) {
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < TX_SLOTS; i++)
      if (!tx_slots[i].busy) return &tx_slots[i];
    drain_tx();
  }
  return 0;
}

/* Sends one packet; data (if any) must stay valid until the tx completes. */
static int tx_packet(struct tx_slot *s, uint64_t dst_cid, uint32_t src_port, uint32_t dst_port, uint16_t op,
                     uint32_t flags, uint32_t buf_alloc, uint32_t fwd_cnt, const void *data, uint32_t len) {
  s->hdr.src_cid = guest_cid;
  s->hdr.dst_cid = dst_cid;
  s->hdr.src_port = src_port;
  s->hdr.dst_port = dst_port;
  s->hdr.len = len;
  s->hdr.type = VSOCK_TYPE_STREAM;
  s->hdr.op = op;
  s->hdr.flags = flags;
  s->hdr.buf_alloc = buf_alloc;
  s->hdr.fwd_cnt = fwd_cnt;
  struct vq_buf bufs[2] = {{&s->hdr, sizeof s->hdr, 0}, {data, len, 0}};
  if (vq_add(&dev->vq[Q_TX], bufs, len ? 2 : 1, s) < 0) return 0;
  s->busy = 1;
  kick_tx = 1;
  st.tx_packets++;
  return 1;
}

/* Control packets must go out: wait for the device to free a tx slot if needed. */
static struct tx_slot *tx_slot_wait(void) {
  struct tx_slot *s = tx_slot_get();
  for (int tries = 0; !s && tries < 100; tries++) {
    vq_kick(dev, &dev->vq[Q_TX]);
    kick_tx = 0;
    vq_wait_used(dev, &dev->vq[Q_TX], 10);
    s = tx_slot_get();
  }
  return s;
}

static void send_ctrl(struct conn *c, uint16_t op, uint32_t flags) {
  struct tx_slot *s = tx_slot_wait();
  if (!s) return;
  s->conn = -1;
  s->rx = -1;
  s->agent_bytes = 0;
  if (!tx_packet(s, c->peer_cid, c->local_port, c->peer_port, op, flags, c->buf_alloc, c->fwd_cnt, 0, 0)) return;
  c->fwd_told = c->fwd_cnt;
  if (op == OP_RST) st.rst_sent++;
}

static void send_rst_to(const struct vsock_hdr *h) {
  if (h->op == OP_RST) return; /* never answer a reset with a reset */
  struct tx_slot *s = tx_slot_wait();
  if (!s) return;
  s->conn = -1;
  s->rx = -1;
  s->agent_bytes = 0;
  if (tx_packet(s, h->src_cid, h->dst_port, h->src_port, OP_RST, 0, 0, 0, 0, 0)) st.rst_sent++;
}

static void rx_release(struct rx_buf *b) {
  if (b->refs == 0 && !b->queued) post_rx(b);
}

static void conn_free(struct conn *c) {
  for (int16_t i = c->echo_head; i >= 0;) {
    struct rx_buf *b = &rx_bufs[i];
    i = b->next;
    b->queued = 0;
    rx_release(b);
  }
  c->echo_head = c->echo_tail = -1;
  c->state = CONN_FREE;
  c->gen++;
}

static struct conn *conn_find(const struct vsock_hdr *h) {
  for (int i = 0; i < MAX_CONNS; i++) {
    struct conn *c = &conns[i];
    if (c->state == CONN_OPEN && c->peer_cid == h->src_cid && c->peer_port == h->src_port && c->local_port == h->dst_port)
      return c;
  }
  return 0;
}

static void conn_accept(const struct vsock_hdr *h) {
  struct conn *c = 0;
  if (h->dst_port == VSOCK_ECHO_PORT || h->dst_port == VSOCK_AGENT_PORT)
    for (int i = 0; i < MAX_CONNS && !c; i++)
      if (conns[i].state == CONN_FREE) c = &conns[i];
  if (!c) {
    st.refused++;
    send_rst_to(h);
    return;
  }
  uint16_t gen = c->gen;
  memset(c, 0, sizeof *c);
  c->gen = gen;
  c->state = CONN_OPEN;
  c->agent = h->dst_port == VSOCK_AGENT_PORT;
  c->peer_cid = h->src_cid;
  c->peer_port = h->src_port;
  c->local_port = h->dst_port;
  c->peer_buf_alloc = h->buf_alloc;
  c->peer_fwd_cnt = h->fwd_cnt;
  c->buf_alloc = c->agent ? RESPONDER_IN_CAP : ECHO_BUF_ALLOC;
  c->echo_head = c->echo_tail = -1;
  if (c->agent) responder_reset(&responders[c - conns]);
  st.accepted++;
  send_ctrl(c, OP_RESPONSE, 0);
}

/* Returns 1 when the buffer was kept (echo data waiting to go back). */
static int handle_packet(struct rx_buf *b, uint32_t written) {
  struct vsock_hdr *h = &b->hdr;
  st.rx_packets++;
  if (written < sizeof *h || h->len > RX_DATA || h->len > written - sizeof *h) {
    st.bad_packets++;
    return 0;
  }
  if (h->dst_cid != guest_cid) {
    st.bad_packets++;
    return 0;
  }
  if (h->type != VSOCK_TYPE_STREAM) {
    send_rst_to(h);
    return 0;
  }
  struct conn *c = conn_find(h);
  if (!c) {
    if (h->op == OP_REQUEST) conn_accept(h);
    else send_rst_to(h);
    return 0;
  }
  /* every header carries the peer's current window */
  c->peer_buf_alloc = h->buf_alloc;
  c->peer_fwd_cnt = h->fwd_cnt;
  c->credit_asked = 0;
  switch (h->op) {
    case OP_RW: {
      if (h->len == 0) return 0;
      if (c->rx_cnt - c->fwd_cnt + h->len > c->buf_alloc) {
        /* the peer ignored our window */
        st.violations++;
        send_ctrl(c, OP_RST, 0);
        conn_free(c);
        return 0;
      }
      c->rx_cnt += h->len;
      if (c->agent) {
        struct responder *r = &responders[c - conns];
        responder_feed(r, b->data, h->len); /* fits: the window is the input buffer */
        c->fwd_cnt += responder_process(r);
        return 0;
      }
      /* Small packets must not pin the receive queue: a window of 64 KiB in
       * 100-byte packets would hold every buffer, and then the host has none
       * left for the CREDIT_UPDATE that would let us echo and free them (a
       * deadlock: the echo stalls for ever). So fill the room left in the last
       * held buffer first and keep this one only for what does not fit, moved
       * to its front: every held buffer but the last is then full, and the
       * window pins at most 64 KiB / 4 KiB + 2 = 18 of the 32 buffers. */
      uint32_t len = h->len, moved = 0;
      if (c->echo_tail >= 0) {
        struct rx_buf *t = &rx_bufs[c->echo_tail];
        uint32_t room = RX_DATA - t->len; /* past what tx packets in flight point at */
        moved = len < room ? len : room;
        memcpy(t->data + t->len, b->data, moved);
        t->len += moved;
        len -= moved;
      }
      if (len == 0) return 0; /* all of it joined the last buffer: this one goes back */
      /* Forward, byte by byte: overlap-safe. Only when something moved: this
       * guest's code runs slowly on a PVM host (measured there: a 4 KiB byte
       * loop per packet made a 1 MiB echo take 11 s instead of 0.3 s). */
      if (moved)
        for (uint32_t i = 0; i < len; i++) b->data[i] = b->data[moved + i];
      b->len = len;
      b->off = 0;
      b->queued = 1;
      b->next = -1;
      int16_t idx = (int16_t)(b - rx_bufs);
      if (c->echo_tail >= 0) rx_bufs[c->echo_tail].next = idx;
      else c->echo_head = idx;
      c->echo_tail = idx;
      return 1;
    }
    case OP_CREDIT_REQUEST:
      send_ctrl(c, OP_CREDIT_UPDATE, 0);
      return 0;
    case OP_CREDIT_UPDATE:
      return 0;
    case OP_SHUTDOWN:
      st.peer_closed++;
      if (h->flags & VSOCK_SHUTDOWN_RCV) { /* nobody reads what we would still send */
        send_ctrl(c, OP_RST, 0);
        conn_free(c);
      } else {
        c->peer_done = 1; /* echo what is queued, then close (in pump) */
      }
      return 0;
    case OP_RST:
      st.rst_received++;
      conn_free(c);
      return 0;
    case OP_REQUEST: /* a second request for a live connection: start over */
    default:
      send_ctrl(c, OP_RST, 0);
      conn_free(c);
      return 0;
  }
}

static void drain_tx(void) {
  void *token;
  uint32_t len;
  while (vq_take_used(dev, &dev->vq[Q_TX], &token, &len)) {
    struct tx_slot *s = token;
    if (!s) continue;
    s->busy = 0;
    if (s->rx >= 0) {
      struct rx_buf *b = &rx_bufs[s->rx];
      if (b->refs) b->refs--;
      rx_release(b);
    }
    if (s->agent_bytes && s->conn >= 0 && conns[s->conn].gen == s->gen && conns[s->conn].state == CONN_OPEN)
      responder_sent(&responders[s->conn], s->agent_bytes);
  }
}

static void drain_rx(void) {
  void *token;
  uint32_t len;
  while (vq_take_used(dev, &dev->vq[Q_RX], &token, &len)) {
    struct rx_buf *b = token;
    if (!b) continue;
    if (!handle_packet(b, len)) post_rx(b);
  }
}

static void transport_reset(void) {
  /* the host dropped every connection (e.g. after a restore): forget ours, keep
   * listening, and re-read our CID, which may have changed */
  for (int i = 0; i < MAX_CONNS; i++)
    if (conns[i].state == CONN_OPEN) conn_free(&conns[i]);
  guest_cid = virtio_config_read64(dev, 0);
  st.transport_resets++;
}

static void drain_event(void) {
  void *token;
  uint32_t len;
  while (vq_take_used(dev, &dev->vq[Q_EVENT], &token, &len)) {
    if (!token) continue;
    int i = (int)((uint32_t *)token - &events[0].event);
    if (i < 0 || i > 1) continue;
    if (len >= 4 && events[i].event == EVENT_TRANSPORT_RESET) transport_reset();
    post_event(i);
  }
}

/* Sends what each connection may send now; returns 1 if anything went out. */
static int pump(void) {
  int sent = 0;
  for (int ci = 0; ci < MAX_CONNS; ci++) {
    struct conn *c = &conns[ci];
    if (c->state != CONN_OPEN) continue;
    if (c->agent) {
      struct responder *r = &responders[ci];
      c->fwd_cnt += responder_process(r); /* answers that waited for room */
      while (r->out_sent < r->out_len) {
        uint32_t n = r->out_len - r->out_sent, credit = peer_credit(c);
        if (n > credit) n = credit;
        if (n > TX_CHUNK) n = TX_CHUNK;
        if (n == 0) break;
        struct tx_slot *s = tx_slot_get();
        if (!s) break;
        s->conn = (int8_t)ci;
        s->gen = c->gen;
        s->rx = -1;
        s->agent_bytes = n;
        if (!tx_packet(s, c->peer_cid, c->local_port, c->peer_port, OP_RW, 0, c->buf_alloc, c->fwd_cnt,
                       r->out + r->out_sent, n))
          break;
        c->fwd_told = c->fwd_cnt;
        c->tx_cnt += n;
        r->out_sent += n;
        sent = 1;
      }
      if (r->closing && r->out_sent >= r->out_len) {
        send_ctrl(c, OP_RST, 0);
        conn_free(c);
        continue;
      }
    } else {
      while (c->echo_head >= 0) {
        struct rx_buf *b = &rx_bufs[c->echo_head];
        uint32_t n = b->len - b->off, credit = peer_credit(c);
        if (n > credit) n = credit;
        if (n == 0) break;
        struct tx_slot *s = tx_slot_get();
        if (!s) break;
        s->conn = (int8_t)ci;
        s->gen = c->gen;
        s->rx = c->echo_head;
        s->agent_bytes = 0;
        /* the bytes leave our buffer as they go out: that is the credit we return */
        c->fwd_cnt += n;
        if (!tx_packet(s, c->peer_cid, c->local_port, c->peer_port, OP_RW, 0, c->buf_alloc, c->fwd_cnt,
                       b->data + b->off, n)) {
          c->fwd_cnt -= n;
          break;
        }
        c->fwd_told = c->fwd_cnt;
        c->tx_cnt += n;
        b->refs++;
        b->off += n;
        st.echo_bytes += n;
        sent = 1;
        if (b->off == b->len) {
          c->echo_head = b->next;
          if (c->echo_head < 0) c->echo_tail = -1;
          b->queued = 0;
          rx_release(b);
        }
      }
      if (c->echo_head >= 0 && peer_credit(c) == 0 && !c->credit_asked) {
        c->credit_asked = 1;
        send_ctrl(c, OP_CREDIT_REQUEST, 0);
      }
    }
    if (c->peer_done) {
      int pending = c->agent ? responders[ci].out_sent < responders[ci].out_len : c->echo_head >= 0;
      if (!pending) {
        send_ctrl(c, OP_RST, 0);
        conn_free(c);
        continue;
      }
    }
    /* consumed without answering (e.g. a dropped oversized frame): give the window back */
    if (c->state == CONN_OPEN && c->fwd_cnt - c->fwd_told >= c->buf_alloc / 4) send_ctrl(c, OP_CREDIT_UPDATE, 0);
  }
  return sent;
}

const char *vsock_init(struct virtio_dev *d, int polled) {
  const char *err = virtio_negotiate(d, VIRTIO_RING_F_EVENT_IDX);
  if (err) return err;
  if ((err = virtio_setup_queue(d, Q_RX, 2 * RX_BUFS))) return err;
  if ((err = virtio_setup_queue(d, Q_TX, 2 * TX_SLOTS))) return err;
  if ((err = virtio_setup_queue(d, Q_EVENT, 2))) return err;
  dev = d;
  guest_cid = virtio_config_read64(d, 0);
  for (int i = 0; i < MAX_CONNS; i++) {
    conns[i].state = CONN_FREE;
    conns[i].echo_head = conns[i].echo_tail = -1;
  }
  virtio_enable_irq(d, polled);
  virtio_driver_ok(d);
  /* as many receive buffers as the queue takes (it may be smaller than asked) */
  for (int i = 0; i < RX_BUFS; i++)
    if (!post_rx(&rx_bufs[i])) break;
  post_event(0);
  post_event(1);
  vsock_poll();
  return 0;
}

static void kick_all(void) {
  if (kick_tx) vq_kick(dev, &dev->vq[Q_TX]);
  if (kick_rx) vq_kick(dev, &dev->vq[Q_RX]);
  if (kick_event) vq_kick(dev, &dev->vq[Q_EVENT]);
  kick_tx = kick_rx = kick_event = 0;
}

void vsock_poll(void) {
  if (!dev) return;
  stalled = 1;
  for (int round = 0; round < 256; round++) {
    drain_tx();
    drain_rx();
    drain_event();
    int sent = pump();
    kick_all();
    /* with EVENT_IDX, ask for the next interrupt and catch what slipped in meanwhile */
    int more = vq_rearm(dev, &dev->vq[Q_RX]) | vq_rearm(dev, &dev->vq[Q_TX]) | vq_rearm(dev, &dev->vq[Q_EVENT]);
    if (!more && !sent) {
      stalled = 0;
      break;
    }
  }
}

void vsock_knock(void) {
  if (!dev) return;
  struct tx_slot *s = tx_slot_wait();
  if (!s) return;
  s->conn = -1;
  s->rx = -1;
  s->agent_bytes = 0;
  if (tx_packet(s, HOST_CID, KNOCK_SRC_PORT, VSOCK_KNOCK_PORT, OP_REQUEST, 0, 0, 0, 0, 0)) st.knocks++;
  vsock_poll(); /* kicks the tx queue */
}

int vsock_busy(void) { return stalled; }

uint64_t vsock_guest_cid(void) { return guest_cid; }

void vsock_report(void) {
  uint32_t open = 0;
  for (int i = 0; i < MAX_CONNS; i++) open += conns[i].state == CONN_OPEN;
  kv_str("vsock", "ok");
  kv_u64("cid", guest_cid);
  kv_u64("conns", open);
  kv_u64("accepted", st.accepted);
  kv_u64("refused", st.refused);
  kv_u64("transport_resets", st.transport_resets);
  kv_u64("rst_sent", st.rst_sent);
  kv_u64("rst_received", st.rst_received);
  kv_u64("peer_closed", st.peer_closed);
  kv_u64("knocks", st.knocks);
  kv_u64("rx_packets", st.rx_packets);
  kv_u64("tx_packets", st.tx_packets);
  kv_u64("bad_packets", st.bad_packets);
  kv_u64("violations", st.violations);
  kv_u64("echo_bytes", st.echo_bytes);
  kv_u64("frames", responder_stats.frames);
  kv_u64("pings", responder_stats.pings);
  kv_u64("echoes", responder_stats.echoes);
  kv_u64("replays", responder_stats.replays);
  kv_u64("errors", responder_stats.errors);
  kv_u64("irq", dev->irq_routed);
  kv_end();
}
