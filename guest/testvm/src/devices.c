#include "devices.h"

#include "config.h"
#include "serial.h"
#include "virtio_net.h"
#include "virtio_rng.h"
#include "vsock.h"

struct devices devices;

static const char *type_name(uint32_t id) {
  switch (id) {
    case VIRTIO_ID_BLOCK: return "blk";
    case VIRTIO_ID_RNG: return "rng";
    case VIRTIO_ID_VSOCK: return "vsock";
    case VIRTIO_ID_NET: return "net";
    default: return "other";
  }
}

static void init_one(uint32_t slot, uint32_t base, uint32_t size, uint32_t gsi) {
  struct virtio_dev *d = &devices.virtio[devices.count];
  int probed = virtio_probe(d, base, size, gsi);
  if (probed == VIRTIO_PROBE_NONE) return; /* empty window (QEMU leaves many) */
  const char *err = 0;
  if (probed == VIRTIO_PROBE_LEGACY) {
    err = "legacy-version-1";
  } else switch (d->device_id) {
    case VIRTIO_ID_BLOCK:
      err = virtio_blk_init(&devices.blk[devices.blk_count], d, config.polled);
      if (!err) devices.blk_count++;
      break;
    case VIRTIO_ID_RNG:
      err = virtio_rng_init(d, config.polled);
      if (!err && !devices.rng) devices.rng = d;
      break;
    case VIRTIO_ID_NET:
      err = virtio_net_init(d, config.polled);
      if (!err && !devices.net) devices.net = d;
      break;
    case VIRTIO_ID_VSOCK:
      err = vsock_init(d, config.polled);
      if (!err && !devices.vsock) devices.vsock = d;
      break;
    default:
      err = "unsupported";
  }
  kv_u64("virtio", slot);
  kv_str("type", type_name(d->device_id));
  kv_hex("base", base);
  kv_u64("gsi", gsi);
  kv_u64("irq", d->irq_routed);
  kv_u64("event_idx", (d->features & VIRTIO_RING_F_EVENT_IDX) != 0);
  /* what the host configured, so a test can check it from the boot output alone */
  if (!err && d->device_id == VIRTIO_ID_BLOCK) kv_u64("capacity", devices.blk[devices.blk_count - 1].capacity);
  if (!err && d->device_id == VIRTIO_ID_VSOCK) kv_u64("cid", vsock_guest_cid());
  kv_str("status", err ? err : "ok");
  kv_end();
  if (probed == VIRTIO_PROBE_OK) devices.count++;
}

void devices_init(void) {
  devices.count = 0;
  if (config.virtio_count) {
    for (uint32_t i = 0; i < config.virtio_count; i++)
      init_one(i, config.virtio[i].base, config.virtio[i].size, config.virtio[i].gsi);
  } else {
    /* torpor's layout (docs/platform.md): device i at 0xd0000000 + i * 4 KiB, GSI 5 + i */
    for (int i = 0; i < config.probe; i++) init_one((uint32_t)i, 0xd0000000u + (uint32_t)i * 0x1000u, 0x1000, 5u + (uint32_t)i);
  }
}
