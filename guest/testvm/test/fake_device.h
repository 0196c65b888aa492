/* A fake virtio-mmio device for the drivers' host-side tests: the register file of a
 * modern (version 2) device and the device half of split virtqueues, working on the
 * driver's rings in this process's memory. */
#ifndef TESTVM_FAKE_DEVICE_H
#define TESTVM_FAKE_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#define FAKE_BASE 0x10000000u

struct fake_queue {
  uint32_t num;
  uint64_t desc, avail, used;
  int ready;
  uint16_t last_avail;
  uint16_t used_idx;
};

struct fake_device {
  uint32_t device_id;
  uint64_t features; /* offered */
  uint64_t driver_features;
  uint32_t status, dev_sel, drv_sel, queue_sel;
  uint32_t isr;
  uint32_t notifies[3];
  uint8_t config[16];
  struct fake_queue q[3];
};

extern struct fake_device fake;

void fake_init(uint32_t device_id, uint64_t features);
/* Takes the next available chain of queue qi. Readable descriptors are gathered into
 * out (up to cap bytes; *out_len set); the chain's writable space is remembered for
 * fake_complete. Returns the head id, or -1 when nothing is available. */
int fake_pop(int qi, uint8_t *out, size_t cap, size_t *out_len);
/* Writes data into the writable descriptors of the chain `head` and marks it used
 * with that length. Returns the bytes written (less than n when the chain is short). */
size_t fake_complete(int qi, int head, const uint8_t *data, size_t n);
/* Buffers available in queue qi right now. */
int fake_available(int qi);

#endif
