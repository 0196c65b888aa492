/* Minimal virtio-mmio (version 2, modern) driver core: probe, feature negotiation,
 * split virtqueues with optional EVENT_IDX, interrupt acknowledgement. Device
 * drivers (blk, rng, vsock) build on it. Everything is static: no allocator. */
#ifndef TESTVM_VIRTIO_H
#define TESTVM_VIRTIO_H

#include <stddef.h>
#include <stdint.h>

#define VIRTIO_ID_BLOCK 2
#define VIRTIO_ID_RNG 4
#define VIRTIO_ID_VSOCK 19

#define VIRTIO_F_VERSION_1 (1ull << 32)
#define VIRTIO_RING_F_EVENT_IDX (1ull << 29)

#define VQ_MAX_SIZE 64
#define VIRTIO_MAX_QUEUES 3

#define VQ_DESC_F_NEXT 1
#define VQ_DESC_F_WRITE 2

struct vq_desc {
  uint64_t addr;
  uint32_t len;
  uint16_t flags;
  uint16_t next;
};

struct vq_used_elem {
  uint32_t id;
  uint32_t len;
};

struct virtq {
  uint16_t size;      /* 0: not set up */
  uint16_t index;
  struct vq_desc *desc;
  volatile uint16_t *avail;   /* flags, idx, ring[size], used_event */
  volatile uint16_t *used;    /* flags, idx, then ring elements, avail_event */
  uint16_t avail_idx;         /* our next avail->idx */
  uint16_t last_used;         /* used entries consumed so far */
  uint16_t free_head;
  uint16_t num_free;
  void *token[VQ_MAX_SIZE];
};

struct vq_buf {
  const void *addr;
  uint32_t len;
  int device_writes;
};

struct virtio_dev {
  uintptr_t base;
  uint32_t window;      /* bytes of MMIO window (from the command line) */
  uint32_t gsi;
  uint32_t device_id;
  int irq_routed;       /* 0: completions are polled */
  uint64_t features;    /* negotiated */
  volatile uint32_t interrupts; /* interrupt status bits seen by the IRQ handler */
  struct virtq vq[VIRTIO_MAX_QUEUES];
};

/* Reads the identification registers: OK for a version-2 (modern) device, NONE for
 * no magic or device id 0 (an empty window), LEGACY for a version-1 device. */
#define VIRTIO_PROBE_NONE 0
#define VIRTIO_PROBE_OK 1
#define VIRTIO_PROBE_LEGACY 2
int virtio_probe(struct virtio_dev *d, uintptr_t base, uint32_t window, uint32_t gsi);
/* Reset, ACKNOWLEDGE, DRIVER, then features: VERSION_1 is required, the `wanted`
 * bits are taken where offered. 0 on success, else a short reason string. */
const char *virtio_negotiate(struct virtio_dev *d, uint64_t wanted);
const char *virtio_setup_queue(struct virtio_dev *d, uint16_t index, uint16_t max_size);
void virtio_driver_ok(struct virtio_dev *d);
/* Routes the device's GSI to virtio_irq (unless polling was asked for). */
void virtio_enable_irq(struct virtio_dev *d, int polled);

uint32_t virtio_config_read32(struct virtio_dev *d, uint32_t off);
uint64_t virtio_config_read64(struct virtio_dev *d, uint32_t off);
uint32_t virtio_status(struct virtio_dev *d);

/* Chains n buffers and publishes them (no notification yet). -1 when the queue
 * lacks free descriptors. */
int vq_add(struct virtq *q, const struct vq_buf *bufs, int n, void *token);
/* Notifies the device if it asked to be (EVENT_IDX) or always without EVENT_IDX. */
void vq_kick(struct virtio_dev *d, struct virtq *q);
/* Takes one used element: 1 with its token and written length, 0 when none. */
int vq_take_used(struct virtio_dev *d, struct virtq *q, void **token, uint32_t *len);
/* After draining: asks for an interrupt at the next used entry (EVENT_IDX) and
 * returns 1 if one slipped in meanwhile (the caller drains again). */
int vq_rearm(struct virtio_dev *d, struct virtq *q);
int vq_has_used(struct virtq *q);

/* Waits (sleeping on interrupts, or spinning when polled) until the queue has a used
 * entry; 0 on timeout. */
int vq_wait_used(struct virtio_dev *d, struct virtq *q, uint32_t timeout_ms);

#endif
