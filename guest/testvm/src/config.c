#include "config.h"

#include "lib.h"

struct config config;

/* `<size>@<base>:<gsi>[:<id>]`, as Linux's virtio_mmio.device= takes it. */
static int parse_virtio_entry(const char *s, struct virtio_entry *e) {
  uint64_t size, base, gsi;
  size_t n = parse_u64(s, &size, 1);
  if (!n || s[n] != '@') return 0;
  s += n + 1;
  n = parse_u64(s, &base, 0);
  if (!n || s[n] != ':') return 0;
  s += n + 1;
  n = parse_u64(s, &gsi, 0);
  if (!n || (s[n] != '\0' && s[n] != ' ' && s[n] != ':')) return 0;
  if (size == 0 || size > 0x100000 || base > 0xffffffffull - size || gsi > 255) return 0;
  e->base = (uint32_t)base;
  e->size = (uint32_t)size;
  e->gsi = (uint32_t)gsi;
  return 1;
}

static int option_on(const char *v) { return !(v[0] == '0' && (v[1] == '\0' || v[1] == ' ')); }

void config_parse(const char *cmdline) {
  memset(&config, 0, sizeof config);
  config.event_idx = 1;
  const char *p = cmdline;
  while (*p) {
    while (*p == ' ') p++;
    if (!*p) break;
    const char *tok = p;
    while (*p && *p != ' ') p++;
    /* copy the token so option values are NUL-terminated */
    char t[MAX_RUN];
    size_t len = (size_t)(p - tok);
    if (len >= sizeof t) continue;
    memcpy(t, tok, len);
    t[len] = '\0';

    if (str_starts(t, "virtio_mmio.device=")) {
      struct virtio_entry e;
      if (config.virtio_count < MAX_VIRTIO_DEVICES && parse_virtio_entry(t + 19, &e))
        config.virtio[config.virtio_count++] = e;
      else
        config.bad_entries++;
    } else if (str_starts(t, "testvm.run=")) {
      memcpy(config.run, t + 11, len - 11 + 1);
    } else if (str_starts(t, "testvm.poll=")) {
      config.polled = option_on(t + 12);
    } else if (str_eq(t, "testvm.poll")) {
      config.polled = 1;
    } else if (str_starts(t, "testvm.count=")) {
      config.count_at_boot = option_on(t + 13);
    } else if (str_starts(t, "testvm.event_idx=")) {
      config.event_idx = option_on(t + 17);
    } else if (str_starts(t, "testvm.agent_ready=")) {
      config.agent_ready = option_on(t + 19);
    } else if (str_starts(t, "testvm.probe=")) {
      uint32_t n;
      if (parse_u32_token(t + 13, &n)) config.probe = n > MAX_VIRTIO_DEVICES ? MAX_VIRTIO_DEVICES : (int)n;
    }
  }
}
