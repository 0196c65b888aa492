/* SYNC, POWEROFF, RESUMED, ECHO: the machine-level requests. */
#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "dispatch.h"
#include "errors.h"
#include "handlers.h"
#include "identity.h"
#include "init.h"
#include "log.h"
#include "netcfg.h"

void handle_sync(struct stream *s, const struct frame *f) {
  (void)f;
  sync();
  answer_ok(s);
}

void handle_echo(struct stream *s, const struct frame *f) {
  const uint8_t *data;
  size_t len;
  frame_find_bytes(f, TP_T_DATA, &data, &len);
  struct tp_writer w;
  if (answer_begin(s, &w, TP_FIELD_HEADER_SIZE + len, TP_OK) != 0) return;
  tp_put_bytes(&w, TP_T_DATA, data ? data : (const uint8_t *)"", len);
  answer_end(s, &w);
}

void handle_poweroff(struct stream *s, const struct frame *f) {
  struct tp_reader r;
  struct tp_field fl;
  int reboot = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_)
    if (fl.tag == TP_T_REBOOT) tp_field_bool(&fl, &reboot);
  answer_ok(s);
  if (!dispatch_init_mode()) {
    log_info("%s requested (host mode: answered only)", reboot ? "reboot" : "poweroff");
    return;
  }
  /* The OK must reach the host before the machine stops. */
  init_shutdown(reboot);
}

/* RESUMED's fields, checked before anything is applied. */
struct resumed_request {
  int64_t time_ns;
  int have_time;
  const uint8_t *entropy;
  size_t entropy_len;
  char hostname[64];  /* "" when absent */
  char machine_id[33];
  uint8_t mac[6];
  int have_mac;
};

/* 0, or the reason the request is refused (INVALID_ARGUMENT). */
static const char *parse_resumed(const struct frame *f, struct resumed_request *q) {
  struct tp_reader r;
  struct tp_field fl;
  memset(q, 0, sizeof *q);
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_) {
    if (fl.tag == TP_T_TIME_NS) q->have_time = tp_field_i64(&fl, &q->time_ns) == TP_OK_;
    if (fl.tag == TP_T_ENTROPY) {
      q->entropy = fl.value;
      q->entropy_len = fl.len;
    }
    /* The frame reader bounded these (63, exactly 32, exactly 6 bytes); checked again here. */
    if ((fl.tag == TP_T_HOSTNAME && fl.len >= sizeof q->hostname) || (fl.tag == TP_T_MACHINE_ID && fl.len != 32) ||
        (fl.tag == TP_T_MAC && fl.len != 6))
      return "identity field of the wrong size";
    if (fl.tag == TP_T_HOSTNAME) {
      memcpy(q->hostname, fl.value, fl.len);
      q->hostname[fl.len] = 0;
      if (strlen(q->hostname) != fl.len || !identity_valid_hostname(q->hostname)) return "hostname: one label of a-z, 0-9 and '-'";
    }
    if (fl.tag == TP_T_MACHINE_ID) {
      memcpy(q->machine_id, fl.value, 32);
      q->machine_id[32] = 0;
      if (!identity_valid_machine_id(q->machine_id)) return "machine_id: 32 lowercase hex digits, not all zero";
    }
    if (fl.tag == TP_T_MAC) {
      memcpy(q->mac, fl.value, 6);
      q->have_mac = 1;
      if (!identity_valid_mac(q->mac)) return "mac: a multicast or all-zero address";
    }
  }
  if (q->have_time && q->time_ns < 0) return "time_ns before the epoch";
  return NULL;
}

/* The sandbox's identity: hostname (the kernel's and /etc's), machine-id, MAC. Best effort
 * (identity.h): what was left as it was goes into note, "" when everything was applied. */
static void apply_identity(const struct resumed_request *q, char *note, size_t size) {
  int left = 0;
  note[0] = 0;
  if (q->hostname[0] && sethostname(q->hostname, strlen(q->hostname)) != 0)
    left++, snprintf(note, size, "hostname not set: %s", strerror(errno));
  char files[256];
  int nf = identity_write_files("", q->hostname[0] ? q->hostname : NULL, q->machine_id[0] ? q->machine_id : NULL, files, sizeof files);
  if (nf && !left++) snprintf(note, size, "%s", files);
  /* A sandbox without a network has no interface to name: nothing to do. */
  int err = q->have_mac ? netcfg_set_mac(q->mac) : 0;
  if (err && err != ENODEV && !left++) snprintf(note, size, "MAC not set: %s", strerror(err));
  if (left) log_error("RESUMED: identity applied in part: %s", note);
}

/* RESUMED: the host's wall clock, fresh entropy and the sandbox's identity after a restore
 * or a boot, applied before any user command runs again (the host sends it before anything
 * else on reconnect). */
void handle_resumed(struct stream *s, const struct frame *f) {
  struct resumed_request q;
  const char *bad = parse_resumed(f, &q);
  if (bad) {
    answer_error(s, CODE_INVALID_ARGUMENT, 0, bad);
    return;
  }
  if (!dispatch_init_mode()) {
    /* An ordinary process on a host (tests) must not move the host's clock, credit the
     * host's RNG with a client's bytes, nor rename the host: answer, and say so. */
    struct tp_writer w;
    if (answer_begin(s, &w, 128, TP_OK) != 0) return;
    tp_put_str(&w, TP_T_MESSAGE, "host mode: clock, RNG and identity left alone");
    answer_end(s, &w);
    return;
  }
  const char *note = NULL;
  int err = 0;
  if (q.have_time) {
    struct timespec ts = {(time_t)(q.time_ns / 1000000000), (long)(q.time_ns % 1000000000)};
    if (clock_settime(CLOCK_REALTIME, &ts) != 0) {
      err = errno;
      note = "clock not set";
    }
  }
  if (q.entropy_len) {
    int fd = open("/dev/urandom", O_RDWR | O_CLOEXEC);
    struct {
      struct rand_pool_info info;
      uint8_t buf[TP_MAX_ENTROPY];
    } pool;
    pool.info.entropy_count = (int)(q.entropy_len * 8);
    pool.info.buf_size = (int)q.entropy_len;
    memcpy(pool.buf, q.entropy, q.entropy_len);
    if (fd < 0 || ioctl(fd, RNDADDENTROPY, &pool.info) != 0 || ioctl(fd, RNDRESEEDCRNG) != 0) {
      if (!err) err = errno;
      note = note ? "clock not set, RNG not reseeded" : "RNG not reseeded";
    }
    if (fd >= 0) close(fd);
  }
  if (err) {
    answer_errno(s, err, note);
    return;
  }
  char partial[320];
  apply_identity(&q, partial, sizeof partial);
  if (!partial[0]) {
    answer_ok(s);
    return;
  }
  struct tp_writer w;
  if (answer_begin(s, &w, 64 + sizeof partial, TP_OK) != 0) return;
  tp_put_str(&w, TP_T_MESSAGE, partial);
  answer_end(s, &w);
}
