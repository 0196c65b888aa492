#include "virtio.h"

#include "config.h"
#include "interrupts.h"
#include "io.h"
#include "lib.h"
#include "wait.h"

#define REG_MAGIC 0x000
#define REG_VERSION 0x004
#define REG_DEVICE_ID 0x008
#define REG_DEVICE_FEATURES 0x010
#define REG_DEVICE_FEATURES_SEL 0x014
#define REG_DRIVER_FEATURES 0x020
#define REG_DRIVER_FEATURES_SEL 0x024
#define REG_QUEUE_SEL 0x030
#define REG_QUEUE_NUM_MAX 0x034
#define REG_QUEUE_NUM 0x038
#define REG_QUEUE_READY 0x044
#define REG_QUEUE_NOTIFY 0x050
#define REG_INTERRUPT_STATUS 0x060
#define REG_INTERRUPT_ACK 0x064
#define REG_STATUS 0x070
#define REG_QUEUE_DESC_LO 0x080
#define REG_QUEUE_DESC_HI 0x084
#define REG_QUEUE_DRIVER_LO 0x090
#define REG_QUEUE_DRIVER_HI 0x094
#define REG_QUEUE_DEVICE_LO 0x0a0
#define REG_QUEUE_DEVICE_HI 0x0a4
#define REG_CONFIG_GENERATION 0x0fc
#define REG_CONFIG 0x100

#define VIRTIO_MAGIC 0x74726976u
#define STATUS_ACKNOWLEDGE 1
#define STATUS_DRIVER 2
#define STATUS_DRIVER_OK 4
#define STATUS_FEATURES_OK 8
#define STATUS_FAILED 128

/* One page per queue holds its descriptor table, avail ring and used ring. */
#define QUEUE_PAGES 8
static uint8_t queue_pages[QUEUE_PAGES][4096] __attribute__((aligned(4096)));
static unsigned queue_pages_used;

static inline uint32_t rd(struct virtio_dev *d, uint32_t reg) { return mmio_read32(d->base + reg); }
static inline void wr(struct virtio_dev *d, uint32_t reg, uint32_t v) { mmio_write32(d->base + reg, v); }
/* An address as a low/high register pair (the high half is 0 in the guest; the
 * host-side tests run this code with 64-bit pointers). */
static void wr_addr(struct virtio_dev *d, uint32_t reg_lo, const void *p) {
  uint64_t a = (uint64_t)(uintptr_t)p;
  wr(d, reg_lo, (uint32_t)a);
  wr(d, reg_lo + 4, (uint32_t)(a >> 32));
}

int virtio_probe(struct virtio_dev *d, uintptr_t base, uint32_t window, uint32_t gsi) {
  memset(d, 0, sizeof *d);
  d->base = base;
  d->window = window;
  d->gsi = gsi;
  if (rd(d, REG_MAGIC) != VIRTIO_MAGIC) return VIRTIO_PROBE_NONE;
  d->device_id = rd(d, REG_DEVICE_ID);
  if (d->device_id == 0) return VIRTIO_PROBE_NONE; /* a window without a device */
  if (rd(d, REG_VERSION) != 2) return VIRTIO_PROBE_LEGACY;
  return VIRTIO_PROBE_OK;
}

uint32_t virtio_status(struct virtio_dev *d) { return rd(d, REG_STATUS); }

const char *virtio_negotiate(struct virtio_dev *d, uint64_t wanted) {
  wr(d, REG_STATUS, 0);
  wr(d, REG_STATUS, STATUS_ACKNOWLEDGE);
  wr(d, REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
  wr(d, REG_DEVICE_FEATURES_SEL, 0);
  uint64_t offered = rd(d, REG_DEVICE_FEATURES);
  wr(d, REG_DEVICE_FEATURES_SEL, 1);
  offered |= (uint64_t)rd(d, REG_DEVICE_FEATURES) << 32;
  if (!(offered & VIRTIO_F_VERSION_1)) {
    wr(d, REG_STATUS, STATUS_FAILED);
    return "no-version-1";
  }
  if (!config.event_idx) wanted &= ~VIRTIO_RING_F_EVENT_IDX;
  d->features = (offered & wanted) | VIRTIO_F_VERSION_1;
  wr(d, REG_DRIVER_FEATURES_SEL, 0);
  wr(d, REG_DRIVER_FEATURES, (uint32_t)d->features);
  wr(d, REG_DRIVER_FEATURES_SEL, 1);
  wr(d, REG_DRIVER_FEATURES, (uint32_t)(d->features >> 32));
  wr(d, REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK);
  if (!(rd(d, REG_STATUS) & STATUS_FEATURES_OK)) {
    wr(d, REG_STATUS, STATUS_FAILED);
    return "features-refused";
  }
  return 0;
}

const char *virtio_setup_queue(struct virtio_dev *d, uint16_t index, uint16_t max_size) {
  if (index >= VIRTIO_MAX_QUEUES) return "queue-index";
  if (queue_pages_used >= QUEUE_PAGES) return "out-of-queue-pages";
  wr(d, REG_QUEUE_SEL, index);
  if (rd(d, REG_QUEUE_READY)) return "queue-already-ready";
  uint32_t max = rd(d, REG_QUEUE_NUM_MAX);
  if (max == 0) return "queue-missing";
  uint16_t size = max_size;
  if (size > VQ_MAX_SIZE) size = VQ_MAX_SIZE;
  if (size > max) size = (uint16_t)max;
  /* split queues need a power of two */
  while (size & (size - 1)) size &= (uint16_t)(size - 1);

  uint8_t *page = queue_pages[queue_pages_used++];
  struct virtq *q = &d->vq[index];
  q->size = size;
  q->index = index;
  q->desc = (struct vq_desc *)page;
  uint32_t avail_off = 16u * size;
  uint32_t used_off = (avail_off + 6u + 2u * size + 3u) & ~3u;
  memset(page, 0, used_off + 6u + 8u * size);
  q->avail = (volatile uint16_t *)(page + avail_off);
  q->used = (volatile uint16_t *)(page + used_off);
  q->avail_idx = 0;
  q->last_used = 0;
  for (uint16_t i = 0; i < size; i++) q->desc[i].next = (uint16_t)(i + 1);
  q->free_head = 0;
  q->num_free = size;

  wr(d, REG_QUEUE_NUM, size);
  wr_addr(d, REG_QUEUE_DESC_LO, q->desc);
  wr_addr(d, REG_QUEUE_DRIVER_LO, (const void *)q->avail);
  wr_addr(d, REG_QUEUE_DEVICE_LO, (const void *)q->used);
  wr(d, REG_QUEUE_READY, 1);
  return 0;
}

void virtio_driver_ok(struct virtio_dev *d) {
  wr(d, REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK);
}

/* IRQ handler: acknowledge what the device raised (used buffer and/or config
 * change) so the next edge comes; the main loop looks at the queues. */
static void virtio_irq(void *ctx) {
  struct virtio_dev *d = ctx;
  uint32_t st = rd(d, REG_INTERRUPT_STATUS);
  if (st) wr(d, REG_INTERRUPT_ACK, st);
  d->interrupts |= st;
}

void virtio_enable_irq(struct virtio_dev *d, int polled) {
  d->irq_routed = !polled && intr_route_gsi(d->gsi, virtio_irq, d);
}

uint32_t virtio_config_read32(struct virtio_dev *d, uint32_t off) {
  uint32_t gen, v;
  do {
    gen = rd(d, REG_CONFIG_GENERATION);
    v = rd(d, REG_CONFIG + off);
  } while (gen != rd(d, REG_CONFIG_GENERATION));
  return v;
}

uint64_t virtio_config_read64(struct virtio_dev *d, uint32_t off) {
  uint32_t gen, lo, hi;
  do {
    gen = rd(d, REG_CONFIG_GENERATION);
    lo = rd(d, REG_CONFIG + off);
    hi = rd(d, REG_CONFIG + off + 4);
  } while (gen != rd(d, REG_CONFIG_GENERATION));
  return ((uint64_t)hi << 32) | lo;
}

#define AVAIL_IDX(q) ((q)->avail[1])
#define AVAIL_RING(q, i) ((q)->avail[2 + (i)])
#define USED_EVENT(q) ((q)->avail[2 + (q)->size])
#define USED_FLAGS(q) ((q)->used[0])
#define USED_IDX(q) ((q)->used[1])
#define USED_ELEM(q, i) (((volatile struct vq_used_elem *)((q)->used + 2))[i])
#define AVAIL_EVENT(q) ((q)->used[2 + 4 * (q)->size])

int vq_add(struct virtq *q, const struct vq_buf *bufs, int n, void *token) {
  if (n <= 0 || q->num_free < n) return -1;
  uint16_t head = q->free_head, idx = head, last = head;
  for (int i = 0; i < n; i++) {
    struct vq_desc *desc = &q->desc[idx];
    desc->addr = (uint64_t)(uintptr_t)bufs[i].addr;
    desc->len = bufs[i].len;
    desc->flags = (uint16_t)((bufs[i].device_writes ? VQ_DESC_F_WRITE : 0) | (i + 1 < n ? VQ_DESC_F_NEXT : 0));
    last = idx;
    idx = desc->next;
  }
  q->free_head = q->desc[last].next;
  q->num_free = (uint16_t)(q->num_free - n);
  q->token[head] = token;
  AVAIL_RING(q, q->avail_idx & (q->size - 1)) = head;
  q->avail_idx++;
  return head;
}

void vq_kick(struct virtio_dev *d, struct virtq *q) {
  uint16_t old = AVAIL_IDX(q);
  uint16_t now = q->avail_idx;
  mb(); /* descriptors and ring entries before the index */
  AVAIL_IDX(q) = now;
  mb(); /* the index before reading whether the device wants a notification */
  if (d->features & VIRTIO_RING_F_EVENT_IDX) {
    uint16_t event = AVAIL_EVENT(q);
    if ((uint16_t)(now - event - 1) >= (uint16_t)(now - old)) return;
  } else if (USED_FLAGS(q) & 1) { /* VRING_USED_F_NO_NOTIFY */
    return;
  }
  wr(d, REG_QUEUE_NOTIFY, q->index);
}

int vq_has_used(struct virtq *q) { return q->size && USED_IDX(q) != q->last_used; }

int vq_take_used(struct virtio_dev *d, struct virtq *q, void **token, uint32_t *len) {
  (void)d;
  if (!vq_has_used(q)) return 0;
  mb(); /* the index before the element */
  volatile struct vq_used_elem *e = &USED_ELEM(q, q->last_used & (q->size - 1));
  uint32_t id = e->id;
  uint32_t n = e->len;
  q->last_used++;
  /* the device is trusted less than nothing here: a bad id must not corrupt the free list */
  if (id >= q->size) {
    *token = 0;
    *len = 0;
    return 1;
  }
  *token = q->token[id];
  q->token[id] = 0;
  *len = n;
  uint16_t idx = (uint16_t)id;
  uint16_t count = 1;
  while ((q->desc[idx].flags & VQ_DESC_F_NEXT) && count < q->size) {
    idx = q->desc[idx].next;
    count++;
  }
  q->desc[idx].next = q->free_head;
  q->free_head = (uint16_t)id;
  q->num_free = (uint16_t)(q->num_free + count);
  return 1;
}

int vq_rearm(struct virtio_dev *d, struct virtq *q) {
  if (d->features & VIRTIO_RING_F_EVENT_IDX) {
    USED_EVENT(q) = q->last_used;
    mb(); /* publish used_event before looking at used->idx again */
  }
  return vq_has_used(q);
}

static int used_ready(void *ctx) { return vq_has_used(ctx); }

int vq_wait_used(struct virtio_dev *d, struct virtq *q, uint32_t timeout_ms) {
  if (vq_rearm(d, q)) return 1;
  return wait_until(used_ready, q, timeout_ms, d->irq_routed);
}
