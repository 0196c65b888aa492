/* torpor-testvm: a tiny PVH guest that exercises the VMM where Linux cannot boot.
 * Boot: banner first (boot -> banner is a benchmark), then interrupts and devices,
 * then the `testvm.run=` list, then commands from the serial port forever. */
#include "agent_ready.h"
#include "boot_info.h"
#include "commands.h"
#include "config.h"
#include "devices.h"
#include "interrupts.h"
#include "io.h"
#include "serial.h"
#include "status.h"
#include "vsock.h"

volatile struct status_page status_page __attribute__((section(".status"), aligned(4096))) = {
    .magic = STATUS_MAGIC,
};

static void serial_irq(void *ctx) {
  (void)ctx;
  serial_drain_rx();
}

/* Counts until an interrupt brings work. In polled mode nothing interrupts, so it
 * comes back every 256 counts to look at the UART and the queues. */
static void count_until_work(void) {
  while (!intr_work) {
    status_page.counter++;
    if (config.polled && (status_page.counter & 0xff) == 0) return;
  }
}

static void main_loop(void) {
  char line[256];
  for (;;) {
    intr_work = 0;
    /* also with interrupts: the handler takes at most a bounded burst, and an
     * edge-triggered line does not fire again while bytes are left in the UART */
    serial_drain_rx();
    while (serial_take_line(line, sizeof line)) command_run_line(line);
    if (devices.vsock) vsock_poll();

    cpu_cli();
    if (intr_work || (devices.vsock && vsock_busy())) {
      cpu_sti();
      continue;
    }
    if (status_page.counting) {
      cpu_sti();
      count_until_work();
    } else if (config.polled) {
      cpu_sti();
    } else {
      cpu_sti_hlt(); /* any interrupt (serial, virtio, timer) wakes us */
    }
  }
}

void kmain(const struct hvm_start_info *si);
void kmain(const struct hvm_start_info *si) {
  uint64_t tsc_at_entry = rdtsc();
  status_page.stage = STAGE_ENTERED;
  serial_init();
  serial_puts("torpor-testvm ready\n");

  boot_info_read(si);
  config_parse(boot_info.cmdline);
  intr_init();
  if (!config.polled) intr_route_gsi(SERIAL_IRQ, serial_irq, 0);
  cpu_sti();
  devices_init();

  kv_str("boot", boot_info.valid ? "ok" : "no-start-info");
  kv_u64("ram_mib", boot_info.ram_bytes >> 20);
  kv_u64("virtio", devices.count);
  kv_u64("blk", devices.blk_count);
  kv_u64("rng", devices.rng != 0);
  kv_u64("vsock", devices.vsock != 0);
  kv_str("mode", config.polled ? "poll" : "irq");
  if (config.bad_entries) kv_u64("bad_virtio_entries", config.bad_entries);
  kv_end();

  status_page.stage = STAGE_READY;
  if (config.count_at_boot) status_page.counting = 1;
  /* after devices_init: the vsock responder already listens on the agent port */
  if (config.agent_ready) agent_ready_announce(tsc_at_entry);
  command_run_list(config.run);
  main_loop();
}
