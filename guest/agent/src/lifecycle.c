/* SYNC, POWEROFF, RESUMED, ECHO: the machine-level requests. */
#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "dispatch.h"
#include "errors.h"
#include "handlers.h"
#include "init.h"
#include "log.h"

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

/* RESUMED: the host's wall clock and fresh entropy after a restore, applied before any
 * user command runs again (the host sends it before anything else on reconnect). */
void handle_resumed(struct stream *s, const struct frame *f) {
  struct tp_reader r;
  struct tp_field fl;
  int64_t t = 0;
  int have_time = 0;
  const uint8_t *entropy = NULL;
  size_t elen = 0;
  tp_reader_init(&r, f->payload, f->h.length);
  while (tp_reader_next(&r, &fl) == TP_OK_) {
    if (fl.tag == TP_T_TIME_NS) have_time = tp_field_i64(&fl, &t) == TP_OK_;
    if (fl.tag == TP_T_ENTROPY) {
      entropy = fl.value;
      elen = fl.len;
    }
  }
  if (!dispatch_init_mode()) {
    /* An ordinary process on a host (tests) must not move the host's clock, nor credit
     * the host's RNG with a client's bytes: answer, and say so. */
    struct tp_writer w;
    if (answer_begin(s, &w, 128, TP_OK) != 0) return;
    tp_put_str(&w, TP_T_MESSAGE, "host mode: clock and RNG left alone");
    answer_end(s, &w);
    return;
  }
  const char *note = NULL;
  int err = 0;
  if (have_time) {
    if (t < 0) {
      answer_error(s, CODE_INVALID_ARGUMENT, 0, "time_ns before the epoch");
      return;
    }
    struct timespec ts = {(time_t)(t / 1000000000), (long)(t % 1000000000)};
    if (clock_settime(CLOCK_REALTIME, &ts) != 0) {
      err = errno;
      note = "clock not set";
    }
  }
  if (elen) {
    int fd = open("/dev/urandom", O_RDWR | O_CLOEXEC);
    struct {
      struct rand_pool_info info;
      uint8_t buf[TP_MAX_ENTROPY];
    } pool;
    pool.info.entropy_count = (int)(elen * 8);
    pool.info.buf_size = (int)elen;
    memcpy(pool.buf, entropy, elen);
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
  answer_ok(s);
}
