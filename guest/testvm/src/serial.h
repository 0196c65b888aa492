/* The 8250/16550 UART at I/O port 0x3f8 (IRQ 4): console output and command input. */
#ifndef TESTVM_SERIAL_H
#define TESTVM_SERIAL_H

#include <stddef.h>
#include <stdint.h>

#define SERIAL_IRQ 4

void serial_init(void);
void serial_write(const char *s, size_t n);
void serial_puts(const char *s);

/* Moves every byte the UART holds into the input ring; from the IRQ handler or, in
 * polled mode, from the main loop. */
void serial_drain_rx(void);
/* Returns 1 and a NUL-terminated line (without CR/LF) when a whole line arrived. */
int serial_take_line(char *out, size_t cap);
/* Bytes dropped because the input ring was full. */
uint32_t serial_rx_dropped(void);

/* Result lines: `key=value key=value ...\n`, written as one line. */
void kv_str(const char *key, const char *value);
void kv_strn(const char *key, const char *value, size_t n);
void kv_u64(const char *key, uint64_t v);
void kv_hex(const char *key, uint32_t v);
void kv_hexbytes(const char *key, const uint8_t *p, size_t n);
void kv_end(void);

#endif
