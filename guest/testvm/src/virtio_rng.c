#include "virtio_rng.h"

const char *virtio_rng_init(struct virtio_dev *d, int polled) {
  const char *err = virtio_negotiate(d, VIRTIO_RING_F_EVENT_IDX);
  if (err) return err;
  if ((err = virtio_setup_queue(d, 0, 8))) return err;
  virtio_enable_irq(d, polled);
  virtio_driver_ok(d);
  return 0;
}

int virtio_rng_read(struct virtio_dev *d, uint8_t *out, uint32_t n) {
  struct virtq *q = &d->vq[0];
  struct vq_buf buf = {out, n, 1};
  if (vq_add(q, &buf, 1, out) < 0) return -1;
  vq_kick(d, q);
  if (!vq_wait_used(d, q, 5000)) return -1;
  void *token;
  uint32_t len;
  if (!vq_take_used(d, q, &token, &len) || token != out) return -1;
  vq_rearm(d, q);
  return (int)(len < n ? len : n);
}
