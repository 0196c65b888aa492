/* virtio-blk: synchronous sector reads and writes, one request at a time. */
#ifndef TESTVM_VIRTIO_BLK_H
#define TESTVM_VIRTIO_BLK_H

#include <stdint.h>

#include "virtio.h"

#define BLK_SECTOR 512u
#define BLK_MAX_SECTORS 8u /* per request: one 4 KiB buffer */

#define VIRTIO_BLK_T_IN 0
#define VIRTIO_BLK_T_OUT 1
#define VIRTIO_BLK_T_FLUSH 4
#define VIRTIO_BLK_T_GET_ID 8

/* Request outcome: the device's status byte (0 ok, 1 ioerr, 2 unsupported), or one of
 * these when the request never completed. */
#define BLK_RESULT_TIMEOUT 0x100
#define BLK_RESULT_QUEUE_FULL 0x101
#define BLK_RESULT_BAD_COMPLETION 0x102

struct virtio_blk {
  struct virtio_dev *dev;
  uint64_t capacity; /* sectors */
  int read_only;
};

const char *virtio_blk_init(struct virtio_blk *b, struct virtio_dev *d, int polled);
/* buf holds count * 512 bytes (count <= BLK_MAX_SECTORS); for GET_ID and FLUSH the
 * sector is ignored and count is the byte length / 512 (0 for FLUSH). */
uint32_t virtio_blk_request(struct virtio_blk *b, uint32_t type, uint64_t sector, void *buf, uint32_t bytes);

#endif
