/* The virtio devices found from the command line (or by probing), with their drivers. */
#ifndef TESTVM_DEVICES_H
#define TESTVM_DEVICES_H

#include <stdint.h>

#include "virtio.h"
#include "virtio_blk.h"

struct devices {
  uint32_t count;
  struct virtio_dev virtio[8];
  uint32_t blk_count;
  struct virtio_blk blk[8];
  struct virtio_dev *rng;
  struct virtio_dev *vsock;
  struct virtio_dev *net;
};

extern struct devices devices;

/* Probes and initialises every device; prints one `virtio=` line per window. */
void devices_init(void);

#endif
