#include "reqid.h"

#include <stdlib.h>
#include <string.h>

#include "frame.h"
#include "util.h"

/* A ring: the newest entry overwrites the oldest. A linear scan of 4096 u64s costs a
 * few microseconds, less than the request it guards. */
static struct reqid_entry ring[REQID_CAPACITY];
static size_t next_slot;

int reqid_is_remembered_type(uint16_t type) {
  switch (type) {
    case TP_EXEC: case TP_STDIN: case TP_PROC_SIGNAL: case TP_PTY_RESIZE: case TP_FILE_WRITE:
    case TP_MKDIR: case TP_REMOVE: case TP_RENAME: case TP_SYNC: case TP_POWEROFF: case TP_RESUMED:
      return 1;
    default:
      return 0;
  }
}

static void clear(struct reqid_entry *e) {
  free(e->answer);
  memset(e, 0, sizeof *e);
}

static struct reqid_entry *lookup(uint64_t id) {
  uint64_t now = now_ms();
  for (size_t i = 0; i < REQID_CAPACITY; i++) {
    struct reqid_entry *e = &ring[i];
    if (!e->state || e->id != id) continue;
    if (now - e->at_ms <= REQID_TTL_MS) return e;
    clear(e); /* expired */
  }
  return NULL;
}

const struct reqid_entry *reqid_find(uint64_t id) { return lookup(id); }

void reqid_begin(uint64_t id) {
  struct reqid_entry *e = lookup(id);
  if (!e) {
    e = &ring[next_slot];
    next_slot = (next_slot + 1) % REQID_CAPACITY;
  }
  clear(e);
  e->id = id;
  e->at_ms = now_ms();
  e->state = REQID_PENDING;
}

void reqid_complete(uint64_t id, uint16_t type, uint16_t flags, const uint8_t *payload, size_t len) {
  struct reqid_entry *e = lookup(id);
  if (!e) return;
  if (len > REQID_MAX_ANSWER) {
    clear(e);
    return;
  }
  uint8_t *copy = malloc(len ? len : 1);
  if (!copy) {
    clear(e);
    return;
  }
  memcpy(copy, payload, len);
  free(e->answer);
  e->answer = copy;
  e->answer_len = len;
  e->type = type;
  e->flags = flags;
  e->state = REQID_DONE;
}

void reqid_set_exec(uint64_t id, pid_t pid) {
  struct reqid_entry *e = lookup(id);
  if (!e) return;
  e->state = REQID_EXEC;
  e->pid = pid;
}

void reqid_forget(uint64_t id) {
  struct reqid_entry *e = lookup(id);
  if (e) clear(e);
}
