/* virtio-net, just enough to prove the path guest -> device -> backend -> guest: a few rx
 * buffers kept posted, one ARP request sent, the answer read back. No offloads. */
#ifndef TESTVM_VIRTIO_NET_H
#define TESTVM_VIRTIO_NET_H

#include <stdint.h>

#include "virtio.h"

#define VIRTIO_ID_NET 1

const char *virtio_net_init(struct virtio_dev *d, int polled);
/* The MAC in config space, and the link status bit (1 up). */
void virtio_net_mac(struct virtio_dev *d, uint8_t mac[6]);
int virtio_net_link_up(struct virtio_dev *d);
/* Sends an ARP request from sender_ip for target_ip (network byte order) and waits up to
 * timeout_ms for the reply. 0 with the replier's MAC, else a short reason string. */
const char *virtio_net_arp(struct virtio_dev *d, uint32_t sender_ip, uint32_t target_ip, uint32_t timeout_ms,
                           uint8_t reply_mac[6]);

#endif
