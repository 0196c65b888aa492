#include "virtio_net.h"

#include "lib.h"

#define NET_F_MAC (1ull << 5)
#define NET_F_STATUS (1ull << 16)
#define NET_HDR 12
#define NET_RX_BUFS 4
#define NET_BUF 1536

static uint8_t rx_buf[NET_RX_BUFS][NET_BUF] __attribute__((aligned(64)));
static uint8_t tx_buf[NET_HDR + 64] __attribute__((aligned(64)));

static int post_rx(struct virtio_dev *d, uint8_t *buf) {
  struct vq_buf b = {buf, NET_BUF, 1};
  return vq_add(&d->vq[0], &b, 1, buf);
}

const char *virtio_net_init(struct virtio_dev *d, int polled) {
  const char *err = virtio_negotiate(d, VIRTIO_RING_F_EVENT_IDX | NET_F_MAC | NET_F_STATUS);
  if (err) return err;
  if ((err = virtio_setup_queue(d, 0, 8))) return err;
  if ((err = virtio_setup_queue(d, 1, 8))) return err;
  for (int i = 0; i < NET_RX_BUFS; i++)
    if (post_rx(d, rx_buf[i]) < 0) return "rx-post";
  virtio_enable_irq(d, polled);
  virtio_driver_ok(d);
  vq_kick(d, &d->vq[0]);
  return 0;
}

void virtio_net_mac(struct virtio_dev *d, uint8_t mac[6]) {
  uint32_t lo = virtio_config_read32(d, 0), hi = virtio_config_read32(d, 4);
  for (int i = 0; i < 4; i++) mac[i] = (uint8_t)(lo >> (8 * i));
  mac[4] = (uint8_t)hi;
  mac[5] = (uint8_t)(hi >> 8);
}

int virtio_net_link_up(struct virtio_dev *d) { return (virtio_config_read32(d, 4) >> 16) & 1; }

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

const char *virtio_net_arp(struct virtio_dev *d, uint32_t sender_ip, uint32_t target_ip, uint32_t timeout_ms,
                           uint8_t reply_mac[6]) {
  uint8_t mac[6];
  virtio_net_mac(d, mac);
  memset(tx_buf, 0, sizeof tx_buf);
  uint8_t *f = tx_buf + NET_HDR;
  memset(f, 0xff, 6);
  memcpy(f + 6, mac, 6);
  put16(f + 12, 0x0806);
  put16(f + 14, 1);
  put16(f + 16, 0x0800);
  f[18] = 6;
  f[19] = 4;
  put16(f + 20, 1);
  memcpy(f + 22, mac, 6);
  memcpy(f + 28, &sender_ip, 4);
  memcpy(f + 38, &target_ip, 4);
  struct virtq *tx = &d->vq[1], *rx = &d->vq[0];
  struct vq_buf b = {tx_buf, NET_HDR + 42, 0};
  if (vq_add(tx, &b, 1, tx_buf) < 0) return "tx-full";
  vq_kick(d, tx);
  if (!vq_wait_used(d, tx, timeout_ms)) return "tx-timeout";
  void *token;
  uint32_t len;
  while (vq_take_used(d, tx, &token, &len)) {
  }
  vq_rearm(d, tx);
  /* Frames other than our answer (IPv6 neighbour traffic...) are skipped, a few at most. */
  for (int tries = 0; tries < 16; tries++) {
    if (!vq_has_used(rx) && !vq_wait_used(d, rx, timeout_ms)) return "rx-timeout";
    if (!vq_take_used(d, rx, &token, &len)) continue;
    uint8_t *r = (uint8_t *)token + NET_HDR;
    int ours = len >= NET_HDR + 42 && r[12] == 0x08 && r[13] == 0x06 && r[20] == 0 && r[21] == 2 &&
               memcmp(r + 28, &target_ip, 4) == 0;
    if (ours) memcpy(reply_mac, r + 22, 6);
    post_rx(d, (uint8_t *)token);
    vq_kick(d, rx);
    vq_rearm(d, rx);
    if (ours) return 0;
  }
  return "no-reply";
}
