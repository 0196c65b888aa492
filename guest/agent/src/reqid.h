/* Request-id memory: the last 4096 ids for 10 minutes, so a request whose answer was
 * lost (a pause, a transport reset) is asked again instead of run twice.
 * Only requests with effects are remembered (EXEC, STDIN, PROC_SIGNAL, PTY_RESIZE,
 * FILE_WRITE, MKDIR, REMOVE, RENAME, SYNC, POWEROFF, RESUMED); read-only ones simply
 * run again. */
#ifndef AGENT_REQID_H
#define AGENT_REQID_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define REQID_CAPACITY 4096
#define REQID_TTL_MS (10u * 60u * 1000u)
/* Answers larger than this are not kept (none of the remembered requests has one). */
#define REQID_MAX_ANSWER 4096

enum reqid_state { REQID_PENDING = 1, REQID_DONE, REQID_EXEC };

struct reqid_entry {
  uint64_t id;
  uint64_t at_ms;
  enum reqid_state state;
  pid_t pid;
  uint16_t type, flags;
  uint8_t *answer;
  size_t answer_len;
};

int reqid_is_remembered_type(uint16_t type);
/* The live entry for id, or NULL. */
const struct reqid_entry *reqid_find(uint64_t id);
void reqid_begin(uint64_t id);
void reqid_complete(uint64_t id, uint16_t type, uint16_t flags, const uint8_t *payload, size_t len);
void reqid_set_exec(uint64_t id, pid_t pid);
void reqid_forget(uint64_t id);

#endif
