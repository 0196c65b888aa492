#include "virtio_blk.h"

#include "lib.h"

#define VIRTIO_BLK_F_RO (1ull << 5)
#define VIRTIO_BLK_F_FLUSH (1ull << 9)

struct blk_req_header {
  uint32_t type;
  uint32_t reserved;
  uint64_t sector;
};

static struct blk_req_header req_header;
static volatile uint8_t req_status;

const char *virtio_blk_init(struct virtio_blk *b, struct virtio_dev *d, int polled) {
  b->dev = d;
  const char *err = virtio_negotiate(d, VIRTIO_BLK_F_RO | VIRTIO_BLK_F_FLUSH | VIRTIO_RING_F_EVENT_IDX);
  if (err) return err;
  if ((err = virtio_setup_queue(d, 0, 16))) return err;
  b->capacity = virtio_config_read64(d, 0);
  b->read_only = (d->features & VIRTIO_BLK_F_RO) != 0;
  virtio_enable_irq(d, polled);
  virtio_driver_ok(d);
  return 0;
}

uint32_t virtio_blk_request(struct virtio_blk *b, uint32_t type, uint64_t sector, void *buf, uint32_t bytes) {
  struct virtq *q = &b->dev->vq[0];
  req_header.type = type;
  req_header.reserved = 0;
  req_header.sector = sector;
  req_status = 0xff;
  struct vq_buf bufs[3];
  int n = 0;
  bufs[n++] = (struct vq_buf){&req_header, sizeof req_header, 0};
  if (bytes) bufs[n++] = (struct vq_buf){buf, bytes, type != VIRTIO_BLK_T_OUT};
  bufs[n++] = (struct vq_buf){(const void *)&req_status, 1, 1};
  if (vq_add(q, bufs, n, &req_header) < 0) return BLK_RESULT_QUEUE_FULL;
  vq_kick(b->dev, q);
  if (!vq_wait_used(b->dev, q, 5000)) return BLK_RESULT_TIMEOUT;
  void *token;
  uint32_t len;
  if (!vq_take_used(b->dev, q, &token, &len) || token != &req_header) return BLK_RESULT_BAD_COMPLETION;
  vq_rearm(b->dev, q);
  return req_status;
}
