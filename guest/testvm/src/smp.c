#include "smp.h"

#include "interrupts.h"
#include "io.h"
#include "lib.h"
#include "status.h"
#include "wait.h"

extern const uint8_t ap_trampoline_start[], ap_trampoline_end[];

#define LAPIC_BASE 0xfee00000u
#define LAPIC_ID 0x020
#define LAPIC_ICR_LO 0x300
#define LAPIC_ICR_HI 0x310
#define ICR_INIT 0x00000500u
#define ICR_STARTUP 0x00000600u
#define ICR_ASSERT 0x00004000u
#define ICR_PENDING 0x00001000u

static int mp_checksum_ok(const uint8_t *p, uint32_t n) {
  uint8_t sum = 0;
  for (uint32_t i = 0; i < n; i++) sum = (uint8_t)(sum + p[i]);
  return sum == 0;
}

/* The MP floating pointer lies on a 16-byte boundary in the EBDA/BIOS area. */
static const uint8_t *find_mp_floating(void) {
  static const uint32_t ranges[][2] = {{0x9fc00, 0xa0000}, {0xf0000, 0x100000}};
  for (unsigned r = 0; r < 2; r++)
    for (uint32_t a = ranges[r][0]; a + 16 <= ranges[r][1]; a += 16) {
      const uint8_t *p = (const uint8_t *)(uintptr_t)a;
      if (p[0] == '_' && p[1] == 'M' && p[2] == 'P' && p[3] == '_' && mp_checksum_ok(p, 16)) return p;
    }
  return 0;
}

uint32_t smp_mp_table_cpus(uint8_t *apic_ids, uint32_t max) {
  const uint8_t *fp = find_mp_floating();
  if (!fp) return 0;
  uint32_t cfg_addr = (uint32_t)fp[4] | (uint32_t)fp[5] << 8 | (uint32_t)fp[6] << 16 | (uint32_t)fp[7] << 24;
  if (cfg_addr < 0x1000 || cfg_addr >= 0x100000) return 0;
  const uint8_t *cfg = (const uint8_t *)(uintptr_t)cfg_addr;
  if (cfg[0] != 'P' || cfg[1] != 'C' || cfg[2] != 'M' || cfg[3] != 'P') return 0;
  uint32_t len = (uint32_t)cfg[4] | (uint32_t)cfg[5] << 8;
  uint32_t entries = (uint32_t)cfg[34] | (uint32_t)cfg[35] << 8;
  if (len < 44 || cfg_addr + len > 0x100000 || !mp_checksum_ok(cfg, len)) return 0;
  uint32_t off = 44, n = 0;
  for (uint32_t e = 0; e < entries && off < len; e++) {
    uint8_t type = cfg[off];
    if (type == 0) { /* processor: 20 bytes; flags bit 0 = enabled */
      if (off + 20 > len) break;
      if ((cfg[off + 3] & 1) && n < max) apic_ids[n++] = cfg[off + 1];
      off += 20;
    } else if (type <= 4) {
      off += 8;
    } else {
      break; /* unknown entry: its size is unknown too */
    }
  }
  return n;
}

static int never(void *ctx) {
  (void)ctx;
  return 0;
}

static void delay_ms(uint32_t ms) { wait_until(never, 0, ms, 1); }

static void send_ipi(uint32_t apic_id, uint32_t icr) {
  mmio_write32(LAPIC_BASE + LAPIC_ICR_HI, apic_id << 24);
  mmio_write32(LAPIC_BASE + LAPIC_ICR_LO, icr);
  for (int i = 0; i < 1000 && (mmio_read32(LAPIC_BASE + LAPIC_ICR_LO) & ICR_PENDING); i++) {
  }
}

struct alive_ctx {
  uint32_t want;
};

static int aps_reached(void *ctx) { return status_page.aps_alive >= ((struct alive_ctx *)ctx)->want; }

uint32_t smp_start(const uint8_t *apic_ids, uint32_t count) {
  uint32_t self = mmio_read32(LAPIC_BASE + LAPIC_ID) >> 24;
  memcpy((void *)(uintptr_t)AP_TRAMPOLINE, ap_trampoline_start, (size_t)(ap_trampoline_end - ap_trampoline_start));
  status_page.aps_stop = 0;
  uint32_t before = status_page.aps_alive, started = 0;
  for (uint32_t i = 0; i < count && started + before < SMP_MAX_CPUS - 1; i++) {
    if (apic_ids[i] == self) continue;
    send_ipi(apic_ids[i], ICR_INIT | ICR_ASSERT);
    delay_ms(10);
    for (int sipi = 0; sipi < 2; sipi++) {
      send_ipi(apic_ids[i], ICR_STARTUP | ICR_ASSERT | (AP_TRAMPOLINE >> 12));
      delay_ms(1);
    }
    started++;
  }
  struct alive_ctx ctx = {before + started};
  wait_until(aps_reached, &ctx, 1000, 1);
  return status_page.aps_alive - before;
}

void ap_main(void);
void ap_main(void) {
  intr_load_idt();
  uint32_t id = mmio_read32(LAPIC_BASE + LAPIC_ID) >> 24;
  __atomic_fetch_add(&status_page.aps_alive, 1, __ATOMIC_SEQ_CST);
  if (id >= SMP_MAX_CPUS) return;
  volatile uint64_t *counter = &status_page.cpu_counter[id];
  while (!status_page.aps_stop) (*counter)++;
}
