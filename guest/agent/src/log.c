#include "log.h"

#include <stdarg.h>
#include <stdio.h>

static int quiet;

void log_set_quiet(int q) { quiet = q; }

static void emit(const char *level, const char *fmt, va_list ap) {
  char line[1024];
  int n = snprintf(line, sizeof line, "torpor-agent: %s", level);
  if (n < 0 || (size_t)n >= sizeof line) return;
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  fprintf(stderr, "%s\n", line);
}

void log_info(const char *fmt, ...) {
  if (quiet) return;
  va_list ap;
  va_start(ap, fmt);
  emit("", fmt, ap);
  va_end(ap);
}

void log_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit("error: ", fmt, ap);
  va_end(ap);
}
