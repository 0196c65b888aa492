#include "fake_device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fake_device fake;

struct desc {
  uint64_t addr;
  uint32_t len;
  uint16_t flags;
  uint16_t next;
};

void fake_init(uint32_t device_id, uint64_t features) {
  memset(&fake, 0, sizeof fake);
  fake.device_id = device_id;
  fake.features = features;
}

uint32_t host_mmio_read32(uintptr_t addr);
void host_mmio_write32(uintptr_t addr, uint32_t v);

uint32_t host_mmio_read32(uintptr_t addr) {
  uint32_t off = (uint32_t)(addr - FAKE_BASE);
  struct fake_queue *q = &fake.q[fake.queue_sel < 3 ? fake.queue_sel : 0];
  switch (off) {
    case 0x000: return 0x74726976;
    case 0x004: return 2;
    case 0x008: return fake.device_id;
    case 0x00c: return 0x554d4551;
    case 0x010: return (uint32_t)(fake.features >> (fake.dev_sel ? 32 : 0));
    case 0x034: return fake.queue_sel < 3 ? 256 : 0;
    case 0x044: return (uint32_t)q->ready;
    case 0x060: return fake.isr;
    case 0x070: return fake.status;
    case 0x0fc: return 0;
  }
  if (off >= 0x100 && off + 4 <= 0x100 + sizeof fake.config) {
    uint32_t v;
    memcpy(&v, fake.config + (off - 0x100), 4);
    return v;
  }
  fprintf(stderr, "fake device: read of 0x%x\n", off);
  abort();
}

void host_mmio_write32(uintptr_t addr, uint32_t v) {
  uint32_t off = (uint32_t)(addr - FAKE_BASE);
  struct fake_queue *q = &fake.q[fake.queue_sel < 3 ? fake.queue_sel : 0];
  switch (off) {
    case 0x014: fake.dev_sel = v; return;
    case 0x020:
      if (fake.drv_sel) fake.driver_features = (fake.driver_features & 0xffffffffull) | ((uint64_t)v << 32);
      else fake.driver_features = (fake.driver_features & ~0xffffffffull) | v;
      return;
    case 0x024: fake.drv_sel = v; return;
    case 0x030: fake.queue_sel = v; return;
    case 0x038: q->num = v; return;
    case 0x044: q->ready = (int)v; return;
    case 0x050: if (v < 3) fake.notifies[v]++; return;
    case 0x064: fake.isr &= ~v; return;
    case 0x070:
      fake.status = v;
      if (v == 0) memset(fake.q, 0, sizeof fake.q);
      return;
    case 0x080: q->desc = (q->desc & ~0xffffffffull) | v; return;
    case 0x084: q->desc = (q->desc & 0xffffffffull) | ((uint64_t)v << 32); return;
    case 0x090: q->avail = (q->avail & ~0xffffffffull) | v; return;
    case 0x094: q->avail = (q->avail & 0xffffffffull) | ((uint64_t)v << 32); return;
    case 0x0a0: q->used = (q->used & ~0xffffffffull) | v; return;
    case 0x0a4: q->used = (q->used & 0xffffffffull) | ((uint64_t)v << 32); return;
  }
  fprintf(stderr, "fake device: write of 0x%x\n", off);
  abort();
}

static volatile uint16_t *avail_ring(struct fake_queue *q) { return (volatile uint16_t *)(uintptr_t)q->avail; }
static struct desc *descs(struct fake_queue *q) { return (struct desc *)(uintptr_t)q->desc; }

int fake_available(int qi) {
  struct fake_queue *q = &fake.q[qi];
  if (!q->ready) return 0;
  return (uint16_t)(avail_ring(q)[1] - q->last_avail);
}

int fake_pop(int qi, uint8_t *out, size_t cap, size_t *out_len) {
  struct fake_queue *q = &fake.q[qi];
  if (!fake_available(qi)) return -1;
  __sync_synchronize();
  uint16_t head = avail_ring(q)[2 + (q->last_avail % q->num)];
  q->last_avail++;
  size_t n = 0;
  uint16_t i = head;
  for (uint32_t hops = 0; hops < q->num; hops++) {
    struct desc *d = &descs(q)[i];
    if (!(d->flags & 2) && out) {
      size_t take = d->len < cap - n ? d->len : cap - n;
      memcpy(out + n, (void *)(uintptr_t)d->addr, take);
      n += take;
    }
    if (!(d->flags & 1)) break;
    i = d->next;
  }
  if (out_len) *out_len = n;
  return head;
}

size_t fake_complete(int qi, int head, const uint8_t *data, size_t n) {
  struct fake_queue *q = &fake.q[qi];
  size_t done = 0;
  uint16_t i = (uint16_t)head;
  for (uint32_t hops = 0; hops < q->num && done < n; hops++) {
    struct desc *d = &descs(q)[i];
    if (d->flags & 2) {
      size_t put = d->len < n - done ? d->len : n - done;
      memcpy((void *)(uintptr_t)d->addr, data + done, put);
      done += put;
    }
    if (!(d->flags & 1)) break;
    i = d->next;
  }
  volatile uint8_t *used = (volatile uint8_t *)(uintptr_t)q->used;
  volatile uint32_t *elem = (volatile uint32_t *)(used + 4 + 8 * (q->used_idx % q->num));
  elem[0] = (uint32_t)head;
  elem[1] = (uint32_t)done;
  __sync_synchronize();
  q->used_idx++;
  *(volatile uint16_t *)(used + 2) = q->used_idx;
  fake.isr |= 1;
  return done;
}
