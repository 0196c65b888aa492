#include "serial.h"

#include "io.h"
#include "lib.h"

#define COM1 0x3f8
#define UART_RBR 0 /* receive buffer (read) */
#define UART_THR 0 /* transmit holding (write) */
#define UART_IER 1
#define UART_IIR 2 /* read */
#define UART_FCR 2 /* write */
#define UART_LCR 3
#define UART_MCR 4
#define UART_LSR 5
#define LSR_DATA_READY 0x01
#define LSR_THR_EMPTY 0x20

/* With the FIFO on, one "THR empty" means 16 bytes may follow: one status read per 16
 * bytes instead of per byte, since every port access is a VM exit. */
static unsigned tx_burst = 1;
static unsigned tx_room;

#define RX_RING 1024
static volatile uint8_t rx_ring[RX_RING];
static volatile uint32_t rx_head, rx_tail; /* head: written by drain; tail: by take_line */
static volatile uint32_t rx_dropped;
static char line_acc[256];
static size_t line_len;

void serial_init(void) {
  outb(COM1 + UART_IER, 0x00);
  outb(COM1 + UART_LCR, 0x80); /* divisor latch: 115200 baud */
  outb(COM1 + UART_RBR, 0x01);
  outb(COM1 + UART_IER, 0x00);
  outb(COM1 + UART_LCR, 0x03); /* 8N1 */
  outb(COM1 + UART_FCR, 0x07); /* FIFO on, both cleared */
  if ((inb(COM1 + UART_IIR) & 0xc0) == 0xc0) tx_burst = 16;
  outb(COM1 + UART_MCR, 0x0b); /* DTR, RTS, OUT2 (OUT2 gates the IRQ line) */
  outb(COM1 + UART_IER, 0x01); /* interrupt on received data */
}

static void put_byte(uint8_t c) {
  if (tx_room == 0) {
    while (!(inb(COM1 + UART_LSR) & LSR_THR_EMPTY)) {
    }
    tx_room = tx_burst;
  }
  outb(COM1 + UART_THR, c);
  tx_room--;
}

void serial_write(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) put_byte((uint8_t)s[i]);
}

void serial_puts(const char *s) { serial_write(s, strlen(s)); }

void serial_drain_rx(void) {
  /* the IRQ handler and the main loop both drain: interrupts off, or a byte read
   * here could be stored after one the handler read later */
  uint32_t flags = irq_save();
  /* bounded: a UART that always claims data must not hang the handler */
  for (int i = 0; i < 256 && (inb(COM1 + UART_LSR) & LSR_DATA_READY); i++) {
    uint8_t c = inb(COM1 + UART_RBR);
    uint32_t next = (rx_head + 1) % RX_RING;
    if (next == rx_tail) {
      rx_dropped++;
      continue;
    }
    rx_ring[rx_head] = c;
    rx_head = next;
  }
  irq_restore(flags);
}

int serial_take_line(char *out, size_t cap) {
  while (rx_tail != rx_head) {
    char c = (char)rx_ring[rx_tail];
    rx_tail = (rx_tail + 1) % RX_RING;
    if (c == '\r' || c == '\n') {
      if (line_len == 0) continue; /* CRLF or empty line */
      size_t n = line_len < cap - 1 ? line_len : cap - 1;
      memcpy(out, line_acc, n);
      out[n] = '\0';
      line_len = 0;
      return 1;
    }
    if (line_len < sizeof line_acc) line_acc[line_len++] = c; /* overlong lines truncate */
  }
  return 0;
}

uint32_t serial_rx_dropped(void) { return rx_dropped; }

static int kv_first = 1;

static void kv_key(const char *key) {
  if (!kv_first) put_byte(' ');
  kv_first = 0;
  serial_puts(key);
  put_byte('=');
}

void kv_str(const char *key, const char *value) {
  kv_key(key);
  serial_puts(value);
}

void kv_strn(const char *key, const char *value, size_t n) {
  kv_key(key);
  /* values never contain spaces or newlines, so lines stay parseable */
  for (size_t i = 0; i < n; i++) {
    char c = value[i];
    put_byte((uint8_t)((c == ' ') ? '_' : (c < 0x20 || c > 0x7e) ? '?' : c));
  }
}

void kv_u64(const char *key, uint64_t v) {
  char buf[24];
  kv_key(key);
  serial_write(buf, fmt_u64_dec(buf, v));
}

void kv_hex(const char *key, uint32_t v) {
  char buf[12];
  kv_key(key);
  serial_write(buf, fmt_hex32(buf, v));
}

void kv_hexbytes(const char *key, const uint8_t *p, size_t n) {
  static const char digits[] = "0123456789abcdef";
  kv_key(key);
  for (size_t i = 0; i < n; i++) {
    put_byte((uint8_t)digits[p[i] >> 4]);
    put_byte((uint8_t)digits[p[i] & 0xf]);
  }
}

void kv_end(void) {
  put_byte('\n');
  kv_first = 1;
}
