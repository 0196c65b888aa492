/* virtio-rng: one device-writable buffer per request. */
#ifndef TESTVM_VIRTIO_RNG_H
#define TESTVM_VIRTIO_RNG_H

#include <stdint.h>

#include "virtio.h"

const char *virtio_rng_init(struct virtio_dev *d, int polled);
/* Fills up to n bytes; returns how many the device wrote, or -1 on timeout. */
int virtio_rng_read(struct virtio_dev *d, uint8_t *out, uint32_t n);

#endif
