#include "commands.h"

#include "boot_info.h"
#include "config.h"
#include "devices.h"
#include "interrupts.h"
#include "io.h"
#include "lib.h"
#include "memtest.h"
#include "serial.h"
#include "smp.h"
#include "status.h"
#include "virtio_net.h"
#include "virtio_rng.h"
#include "vsock.h"
#include "wait.h"

#define MAX_ARGS 8

void triple_fault(void);

struct command {
  const char *name;
  void (*run)(int argc, char **argv);
  const char *usage;
};

static void result_error(const char *cmd, const char *reason) {
  kv_str(cmd, "error");
  kv_str("reason", reason);
  kv_end();
}

/* Optional numeric argument i, or `dflt` when absent. 0 when present but not a number. */
static int arg_u32(int argc, char **argv, int i, uint32_t dflt, uint32_t *out) {
  if (i >= argc) {
    *out = dflt;
    return 1;
  }
  return parse_u32_token(argv[i], out);
}

static uint32_t fnv1a(const uint8_t *p, uint32_t n) {
  uint32_t h = 0x811c9dc5u;
  for (uint32_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x01000193u;
  return h;
}

static void cmd_help(int argc, char **argv);

static void cmd_echo(int argc, char **argv) {
  /* the line is re-joined with single spaces: echo=<text> */
  serial_puts("echo=");
  for (int i = 1; i < argc; i++) {
    if (i > 1) serial_puts(" ");
    serial_puts(argv[i]);
  }
  kv_end();
}

static void cmd_info(int argc, char **argv) {
  (void)argc, (void)argv;
  kv_str("info", "ok");
  kv_u64("ram_mib", boot_info.ram_bytes >> 20);
  kv_u64("memmap", boot_info.memmap_count);
  kv_u64("virtio", devices.count);
  kv_u64("blk", devices.blk_count);
  kv_u64("rng", devices.rng != 0);
  kv_u64("vsock", devices.vsock != 0);
  kv_u64("lapic_id", intr_lapic_id());
  kv_u64("ioapic_pins", intr_ioapic_pins());
  kv_str("mode", config.polled ? "poll" : "irq");
  kv_hex("status_page", (uint32_t)(uintptr_t)&status_page);
  kv_strn("cmdline", boot_info.cmdline, strlen(boot_info.cmdline));
  kv_end();
}

static void cmd_count(int argc, char **argv) {
  if (argc > 1) {
    if (str_eq(argv[1], "start")) status_page.counting = 1;
    else if (str_eq(argv[1], "stop")) status_page.counting = 0;
    else return result_error("count", "usage");
  }
  kv_u64("count", status_page.counter);
  kv_u64("running", status_page.counting);
  kv_hex("addr", (uint32_t)(uintptr_t)&status_page.counter);
  kv_end();
}

/* mem[-write|-verify] [tag] [pages] [base] */
static int mem_args(const char *cmd, int argc, char **argv, uint32_t *tag, uint32_t *pages, uint32_t *base) {
  if (!arg_u32(argc, argv, 1, 0x7e570000u, tag) || !arg_u32(argc, argv, 2, MEM_DEFAULT_PAGES, pages) ||
      !arg_u32(argc, argv, 3, MEM_DEFAULT_BASE, base)) {
    result_error(cmd, "usage");
    return 0;
  }
  if ((*base & 0xfff) || *pages == 0 || *pages > 0x100000u || !boot_ram_contains(*base, (uint64_t)*pages * 4096u)) {
    result_error(cmd, "not-ram");
    return 0;
  }
  return 1;
}

static void mem_report(const char *cmd, const char *outcome, uint32_t tag, uint32_t pages, uint32_t base,
                       const struct mem_result *r) {
  kv_str(cmd, outcome);
  kv_hex("tag", tag);
  kv_u64("pages", pages);
  kv_hex("base", base);
  if (r) {
    kv_u64("bad", r->bad);
    if (r->bad) {
      kv_hex("first_bad", r->first_bad);
      kv_hex("seen", r->seen);
    }
  }
  kv_end();
}

static void cmd_mem_write(int argc, char **argv) {
  uint32_t tag, pages, base;
  if (!mem_args("mem-write", argc, argv, &tag, &pages, &base)) return;
  mem_write(base, pages, tag);
  status_page.last_mem_tag = tag;
  status_page.last_mem_pages = pages;
  status_page.last_mem_base = base;
  mem_report("mem-write", "ok", tag, pages, base, 0);
}

static void cmd_mem_verify(int argc, char **argv) {
  uint32_t tag, pages, base;
  struct mem_result r;
  if (!mem_args("mem-verify", argc, argv, &tag, &pages, &base)) return;
  mem_verify(base, pages, tag, &r);
  mem_report("mem-verify", r.bad ? "bad" : "ok", tag, pages, base, &r);
}

static void cmd_mem(int argc, char **argv) {
  uint32_t tag, pages, base;
  struct mem_result r;
  if (!mem_args("mem", argc, argv, &tag, &pages, &base)) return;
  mem_write(base, pages, tag);
  status_page.last_mem_tag = tag;
  status_page.last_mem_pages = pages;
  status_page.last_mem_base = base;
  mem_verify(base, pages, tag, &r);
  mem_report("mem", r.bad ? "bad" : "ok", tag, pages, base, &r);
}

static void cmd_peek(int argc, char **argv) {
  uint32_t addr;
  if (argc < 2 || !parse_u32_token(argv[1], &addr) || (addr & 3)) return result_error("peek", "usage");
  if (!boot_ram_contains(addr, 4)) return result_error("peek", "not-ram");
  kv_hex("peek", *(volatile uint32_t *)(uintptr_t)addr);
  kv_hex("addr", addr);
  kv_end();
}

static void cmd_poke(int argc, char **argv) {
  uint32_t addr, value;
  if (argc < 3 || !parse_u32_token(argv[1], &addr) || !parse_u32_token(argv[2], &value) || (addr & 3))
    return result_error("poke", "usage");
  if (!boot_ram_contains(addr, 4)) return result_error("poke", "not-ram");
  *(volatile uint32_t *)(uintptr_t)addr = value;
  kv_str("poke", "ok");
  kv_hex("addr", addr);
  kv_hex("value", value);
  kv_end();
}

static uint8_t blk_buf[BLK_MAX_SECTORS * BLK_SECTOR] __attribute__((aligned(4096)));

static struct virtio_blk *blk_arg(const char *cmd, int argc, char **argv, int i) {
  uint32_t dev;
  if (!arg_u32(argc, argv, i, 0, &dev)) {
    result_error(cmd, "usage");
    return 0;
  }
  if (dev >= devices.blk_count) {
    result_error(cmd, "no-device");
    return 0;
  }
  return &devices.blk[dev];
}

static int blk_outcome(const char *cmd, uint32_t st) {
  if (st == 0) return 1;
  kv_str(cmd, "error");
  kv_str("reason", st == 1 ? "ioerr" : st == 2 ? "unsupported" : st == BLK_RESULT_TIMEOUT ? "timeout" : "device");
  kv_hex("status", st);
  kv_end();
  return 0;
}

/* The blk pattern: 32-bit word at disk byte offset o holds tag ^ o. */
static void blk_fill(uint32_t tag, uint64_t sector, uint32_t count) {
  uint32_t base = (uint32_t)sector * BLK_SECTOR;
  for (uint32_t i = 0; i < count * BLK_SECTOR / 4; i++) ((uint32_t *)blk_buf)[i] = tag ^ (base + i * 4);
}

static void cmd_blk(int argc, char **argv) {
  struct virtio_blk *b = blk_arg("blk", argc, argv, 1);
  if (!b) return;
  kv_str("blk", "ok");
  kv_u64("capacity", b->capacity);
  kv_u64("read_only", b->read_only);
  kv_u64("irq", b->dev->irq_routed);
  kv_hex("features_lo", (uint32_t)b->dev->features);
  kv_hex("features_hi", (uint32_t)(b->dev->features >> 32));
  kv_end();
}

/* blk-read <sector> [count] [dev] */
static void cmd_blk_read(int argc, char **argv) {
  uint32_t sector, count;
  if (argc < 2 || !parse_u32_token(argv[1], &sector) || !arg_u32(argc, argv, 2, 1, &count) || count == 0 ||
      count > BLK_MAX_SECTORS)
    return result_error("blk-read", "usage");
  struct virtio_blk *b = blk_arg("blk-read", argc, argv, 3);
  if (!b) return;
  memset(blk_buf, 0, count * BLK_SECTOR);
  if (!blk_outcome("blk-read", virtio_blk_request(b, VIRTIO_BLK_T_IN, sector, blk_buf, count * BLK_SECTOR))) return;
  kv_str("blk-read", "ok");
  kv_u64("sector", sector);
  kv_u64("count", count);
  kv_hex("fnv", fnv1a(blk_buf, count * BLK_SECTOR));
  kv_hexbytes("head", blk_buf, 16);
  kv_end();
}

/* blk-write <sector> <tag> [count] [dev] */
static void cmd_blk_write(int argc, char **argv) {
  uint32_t sector, tag, count;
  if (argc < 3 || !parse_u32_token(argv[1], &sector) || !parse_u32_token(argv[2], &tag) ||
      !arg_u32(argc, argv, 3, 1, &count) || count == 0 || count > BLK_MAX_SECTORS)
    return result_error("blk-write", "usage");
  struct virtio_blk *b = blk_arg("blk-write", argc, argv, 4);
  if (!b) return;
  blk_fill(tag, sector, count);
  if (!blk_outcome("blk-write", virtio_blk_request(b, VIRTIO_BLK_T_OUT, sector, blk_buf, count * BLK_SECTOR)))
    return;
  kv_str("blk-write", "ok");
  kv_u64("sector", sector);
  kv_u64("count", count);
  kv_hex("fnv", fnv1a(blk_buf, count * BLK_SECTOR));
  kv_end();
}

/* blk-verify <sector> <tag> [count] [dev]: reads and compares with the pattern */
static void cmd_blk_verify(int argc, char **argv) {
  uint32_t sector, tag, count;
  if (argc < 3 || !parse_u32_token(argv[1], &sector) || !parse_u32_token(argv[2], &tag) ||
      !arg_u32(argc, argv, 3, 1, &count) || count == 0 || count > BLK_MAX_SECTORS)
    return result_error("blk-verify", "usage");
  struct virtio_blk *b = blk_arg("blk-verify", argc, argv, 4);
  if (!b) return;
  if (!blk_outcome("blk-verify", virtio_blk_request(b, VIRTIO_BLK_T_IN, sector, blk_buf, count * BLK_SECTOR)))
    return;
  uint32_t base = sector * BLK_SECTOR, bad = 0;
  for (uint32_t i = 0; i < count * BLK_SECTOR / 4; i++)
    if (((uint32_t *)blk_buf)[i] != (tag ^ (base + i * 4))) bad++;
  kv_str("blk-verify", bad ? "bad" : "ok");
  kv_u64("sector", sector);
  kv_u64("count", count);
  kv_u64("bad_words", bad);
  kv_end();
}

/* blk-bench <requests> [read|write] [dev]: back-to-back 4 KiB requests over the disk's
 * first sectors (wrapping at its end); the host times the command, tsc is the guest's */
static void cmd_blk_bench(int argc, char **argv) {
  uint32_t requests;
  if (argc < 2 || !parse_u32_token(argv[1], &requests) || requests == 0 || requests > 1000000)
    return result_error("blk-bench", "usage");
  int write = argc > 2 && str_eq(argv[2], "write");
  if (argc > 2 && !write && !str_eq(argv[2], "read")) return result_error("blk-bench", "usage");
  struct virtio_blk *b = blk_arg("blk-bench", argc, argv, 3);
  if (!b) return;
  if (b->capacity < BLK_MAX_SECTORS) return result_error("blk-bench", "disk-too-small");
  uint32_t span = b->capacity > 0x100000 ? 0x100000 : (uint32_t)b->capacity; /* first 512 MiB at most */
  span -= span % BLK_MAX_SECTORS;
  if (write) blk_fill(0xbe9c0000u, 0, BLK_MAX_SECTORS);
  uint64_t t0 = rdtsc();
  uint32_t sector = 0;
  for (uint32_t i = 0; i < requests; i++) {
    uint32_t st = virtio_blk_request(b, write ? VIRTIO_BLK_T_OUT : VIRTIO_BLK_T_IN, sector, blk_buf,
                                     BLK_MAX_SECTORS * BLK_SECTOR);
    if (!blk_outcome("blk-bench", st)) return;
    sector = (sector + BLK_MAX_SECTORS) % span;
  }
  kv_str("blk-bench", "ok");
  kv_str("op", write ? "write" : "read");
  kv_u64("requests", requests);
  kv_u64("bytes", (uint64_t)requests * BLK_MAX_SECTORS * BLK_SECTOR);
  kv_u64("tsc", rdtsc() - t0);
  kv_end();
}

static void cmd_blk_flush(int argc, char **argv) {
  struct virtio_blk *b = blk_arg("blk-flush", argc, argv, 1);
  if (!b) return;
  if (!blk_outcome("blk-flush", virtio_blk_request(b, VIRTIO_BLK_T_FLUSH, 0, 0, 0))) return;
  kv_str("blk-flush", "ok");
  kv_end();
}

static void cmd_blk_id(int argc, char **argv) {
  struct virtio_blk *b = blk_arg("blk-id", argc, argv, 1);
  if (!b) return;
  memset(blk_buf, 0, 20);
  if (!blk_outcome("blk-id", virtio_blk_request(b, VIRTIO_BLK_T_GET_ID, 0, blk_buf, 20))) return;
  kv_strn("blk-id", (const char *)blk_buf, strlen((const char *)blk_buf) < 20 ? strlen((const char *)blk_buf) : 20);
  kv_end();
}

static void cmd_rng(int argc, char **argv) {
  static uint8_t buf[64] __attribute__((aligned(64)));
  uint32_t n;
  if (!arg_u32(argc, argv, 1, 16, &n) || n == 0 || n > sizeof buf) return result_error("rng", "usage");
  if (!devices.rng) return result_error("rng", "no-device");
  int got = virtio_rng_read(devices.rng, buf, n);
  if (got < 0) return result_error("rng", "timeout");
  kv_hexbytes("rng", buf, (uint32_t)got);
  kv_u64("len", (uint32_t)got);
  kv_end();
}

/* net-arp: ARP for the gateway 10.0.2.2 as 10.0.2.15 (lib/net's addresses). */
static void cmd_net_arp(int argc, char **argv) {
  (void)argc, (void)argv;
  if (!devices.net) return result_error("net-arp", "no-device");
  uint8_t mac[6], reply[6];
  virtio_net_mac(devices.net, mac);
  uint32_t me = 10u | 0u << 8 | 2u << 16 | 15u << 24, gw = 10u | 0u << 8 | 2u << 16 | 2u << 24;
  const char *err = virtio_net_arp(devices.net, me, gw, 3000, reply);
  if (err) return result_error("net-arp", err);
  kv_str("net-arp", "ok");
  kv_hexbytes("mac", mac, 6);
  kv_u64("link", (uint64_t)virtio_net_link_up(devices.net));
  kv_hexbytes("gateway", reply, 6);
  kv_end();
}

static void cmd_irq(int argc, char **argv) {
  (void)argc, (void)argv;
  kv_str("irq", "ok");
  kv_u64("timer", intr_timer_count);
  kv_u64("spurious", intr_spurious_count);
  kv_u64("rescued", wait_rescued);
  static const char *const names[MAX_GSI] = {"gsi0",  "gsi1",  "gsi2",  "gsi3",  "gsi4",  "gsi5",  "gsi6",  "gsi7",
                                              "gsi8",  "gsi9",  "gsi10", "gsi11", "gsi12", "gsi13", "gsi14", "gsi15",
                                              "gsi16", "gsi17", "gsi18", "gsi19", "gsi20", "gsi21", "gsi22", "gsi23"};
  for (int i = 0; i < MAX_GSI; i++)
    if (intr_gsi_count[i]) kv_u64(names[i], intr_gsi_count[i]);
  kv_end();
}

/* timer [us]: one LAPIC one-shot; spins on the count (bounded by the TSC) so a timer
 * that never fires is reported, not waited for forever. */
static void cmd_timer(int argc, char **argv) {
  uint32_t us;
  if (!arg_u32(argc, argv, 1, 1000, &us) || us == 0 || us > 4000000u) return result_error("timer", "usage");
  uint32_t before = intr_timer_count;
  uint64_t t0 = rdtsc();
  intr_timer_oneshot(us * 1000u);
  uint64_t limit = 1ull << 36; /* tens of seconds of TSC on any host */
  while (intr_timer_count == before && rdtsc() - t0 < limit) {
  }
  uint64_t dt = rdtsc() - t0;
  kv_str("timer", intr_timer_count != before ? "ok" : "timeout");
  kv_u64("us", us);
  kv_u64("tsc", dt);
  kv_u64("fired", intr_timer_count);
  kv_end();
}

static void cmd_vsock(int argc, char **argv) {
  (void)argc, (void)argv;
  if (!devices.vsock) return result_error("vsock", "no-device");
  vsock_report();
}

/* knock [count]: the agent's knock, `count` times in a row (the host must count, not queue). */
static void cmd_knock(int argc, char **argv) {
  uint32_t count;
  if (!devices.vsock) return result_error("knock", "no-device");
  if (!arg_u32(argc, argv, 1, 1, &count) || count == 0 || count > 100000) return result_error("knock", "usage");
  for (uint32_t i = 0; i < count; i++) vsock_knock();
  kv_str("knock", "ok");
  kv_u64("count", count);
  kv_end();
}

/* flood-console <KiB>: a hostile guest's console flood. Writes that many KiB
 * (whole 4 KiB pages of text) to COM1 as fast as the port takes them: a
 * `rep outsb` per page, without polling the line status register (KVM may
 * still exit once per byte). The host must keep its memory bounded. */
static void cmd_flood_console(int argc, char **argv) {
  static uint8_t page[4096];
  uint32_t kib;
  if (argc < 2 || !parse_u32_token(argv[1], &kib) || kib == 0 || kib > 4u * 1024 * 1024)
    return result_error("flood-console", "usage");
  for (uint32_t i = 0; i < sizeof page; i++) page[i] = (uint8_t)((i % 64) == 63 ? '\n' : 'a' + i % 26);
  for (uint32_t n = 0; n < kib / 4; n++) {
    const uint8_t *p = page;
    uint32_t count = sizeof page;
    __asm__ volatile("rep outsb" : "+S"(p), "+c"(count) : "d"((uint16_t)0x3f8) : "memory");
  }
  kv_str("flood-console", "ok");
  kv_u64("kib", kib / 4 * 4);
  kv_end();
}

static void cmd_reset(int argc, char **argv) {
  (void)argc, (void)argv;
  kv_str("reset", "now");
  kv_end();
  outb(0x64, 0xfe); /* i8042: pulse the CPU reset line */
  result_error("reset", "still-running");
}

static void cmd_triple(int argc, char **argv) {
  (void)argc, (void)argv;
  kv_str("triple", "now");
  kv_end();
  triple_fault();
}

static void cmd_halt(int argc, char **argv) {
  (void)argc, (void)argv;
  kv_str("halt", "now");
  kv_end();
  status_page.stage = STAGE_HALTED;
  cpu_halt_forever();
}

/* smp: report; smp start [count]: starts the APs of the MP table (or APIC ids
 * 1..count-1 without one); smp stop: the APs halt */
static void cmd_smp(int argc, char **argv) {
  uint8_t ids[SMP_MAX_CPUS];
  uint32_t n = smp_mp_table_cpus(ids, SMP_MAX_CPUS), started = 0;
  if (argc > 1 && str_eq(argv[1], "stop")) {
    status_page.aps_stop = 1;
  } else if (argc > 1 && str_eq(argv[1], "start")) {
    if (argc > 2) {
      uint32_t count;
      if (!parse_u32_token(argv[2], &count) || count == 0 || count > SMP_MAX_CPUS) return result_error("smp", "usage");
      for (n = 0; n < count; n++) ids[n] = (uint8_t)n;
    } else if (n == 0) {
      return result_error("smp", "no-mp-table");
    }
    started = smp_start(ids, n);
  } else if (argc > 1) {
    return result_error("smp", "usage");
  }
  kv_str("smp", "ok");
  kv_u64("cpus", n);
  kv_u64("started", started);
  kv_u64("alive", status_page.aps_alive);
  kv_u64("stopped", status_page.aps_stop);
  static const char *const names[SMP_MAX_CPUS] = {"cpu0", "cpu1", "cpu2", "cpu3", "cpu4", "cpu5", "cpu6", "cpu7"};
  for (uint32_t i = 1; i < SMP_MAX_CPUS; i++)
    if (status_page.cpu_counter[i]) kv_u64(names[i], status_page.cpu_counter[i]);
  kv_end();
}

static const struct command commands[] = {
    {"help", cmd_help, ""},
    {"echo", cmd_echo, "<text>"},
    {"info", cmd_info, ""},
    {"count", cmd_count, "[start|stop]"},
    {"mem", cmd_mem, "[tag] [pages] [base]"},
    {"mem-write", cmd_mem_write, "[tag] [pages] [base]"},
    {"mem-verify", cmd_mem_verify, "[tag] [pages] [base]"},
    {"peek", cmd_peek, "<addr>"},
    {"poke", cmd_poke, "<addr> <value>"},
    {"blk", cmd_blk, "[dev]"},
    {"blk-read", cmd_blk_read, "<sector> [count] [dev]"},
    {"blk-write", cmd_blk_write, "<sector> <tag> [count] [dev]"},
    {"blk-verify", cmd_blk_verify, "<sector> <tag> [count] [dev]"},
    {"blk-flush", cmd_blk_flush, "[dev]"},
    {"blk-bench", cmd_blk_bench, "<requests> [read|write] [dev]"},
    {"blk-id", cmd_blk_id, "[dev]"},
    {"rng", cmd_rng, "[bytes]"},
    {"net-arp", cmd_net_arp, ""},
    {"irq", cmd_irq, ""},
    {"timer", cmd_timer, "[us]"},
    {"vsock", cmd_vsock, ""},
    {"knock", cmd_knock, "[count]"},
    {"smp", cmd_smp, "[start [count]|stop]"},
    {"flood-console", cmd_flood_console, "<KiB>"},
    {"reset", cmd_reset, ""},
    {"triple", cmd_triple, ""},
    {"halt", cmd_halt, ""},
};

#define COMMAND_COUNT (sizeof commands / sizeof commands[0])

static void cmd_help(int argc, char **argv) {
  (void)argc, (void)argv;
  serial_puts("help=");
  for (unsigned i = 0; i < COMMAND_COUNT; i++) {
    if (i) serial_puts(",");
    serial_puts(commands[i].name);
  }
  kv_end();
}

void command_run_line(char *line) {
  char *argv[MAX_ARGS];
  int argc = 0;
  char *p = line;
  while (*p && argc < MAX_ARGS) {
    while (*p == ' ' || *p == '\t') *p++ = '\0';
    if (!*p) break;
    argv[argc++] = p;
    while (*p && *p != ' ' && *p != '\t') p++;
  }
  if (argc == 0) return;
  status_page.commands++;
  for (unsigned i = 0; i < COMMAND_COUNT; i++) {
    if (str_eq(argv[0], commands[i].name)) {
      commands[i].run(argc, argv);
      return;
    }
  }
  kv_str("error", "unknown-command");
  kv_strn("command", argv[0], strlen(argv[0]));
  kv_end();
}

void command_run_list(const char *list) {
  char line[MAX_RUN];
  const char *p = list;
  while (*p) {
    size_t n = 0;
    while (*p && *p != ',' && n < sizeof line - 1) {
      line[n++] = (*p == ':') ? ' ' : *p;
      p++;
    }
    line[n] = '\0';
    if (*p == ',') p++;
    command_run_line(line);
  }
}
