/* The process table: running processes and the last 64 ended ones, each with the kept
 * tail of its stdout and stderr (ring.h), its exit status, its stdin queue and the
 * streams subscribed to its output. Processes outlive the connection that started them. */
#ifndef AGENT_PROC_H
#define AGENT_PROC_H

#include <stdint.h>
#include <sys/types.h>

#include "conn.h"
#include "loop.h"
#include "ring.h"
#include "spawn.h"

#define PROC_KEEP_ENDED 64
/* Kept output of ended processes, all of them together: beyond it the oldest ended
 * process's tails are dropped first (its exit status stays), so 64 ended processes cannot
 * pin 128 MiB of a small guest's memory. */
#define PROC_ENDED_OUTPUT_BUDGET (16u << 20)
/* A subscriber this far behind the newest output stops the agent reading the process's
 * pipe (back-pressure), well before the 1 MiB tail could drop bytes it still needs. */
#define PROC_PAUSE_BACKLOG (256u * 1024u)
/* How long output pipes may stay open after the process exited (held by an orphan). */
#define PROC_DRAIN_MS 250u

struct proc;

struct proc_out {
  struct watcher w;
  struct proc *p;
  int which; /* 0 stdout (or the pty), 1 stderr */
  int open;
  int paused;
  struct ring ring;
};

struct proc_sub {
  struct proc_sub *next;
  struct proc *p;
  struct stream *s;
  uint64_t off[2];
};

struct stdin_req {
  struct stdin_req *next;
  uint8_t *data;
  size_t len, done;
  int close_after;
  struct stream *s; /* NULL once the requester is gone */
  /* The requester went away (transport reset) with its request id remembered: the
   * bytes are still written, so the id must then read as done, never as "run again". */
  int remember;
  uint64_t request_id;
};

struct proc {
  struct proc *next;
  pid_t pid;
  /* What PROC_LIST reports. */
  char **argv;
  char *shell;
  char *cwd;
  char *tag;
  char **env; /* the request's additions only */
  int is_pty;
  struct proc_out out[2];
  int stdin_fd;
  struct watcher stdin_w;
  struct stdin_req *stdin_head, *stdin_tail;
  size_t stdin_queued;
  int reaped, finished, timed_out;
  int status; /* waitpid status */
  uint64_t deadline_ms;       /* timeout_ms, 0 = none */
  uint64_t drain_deadline_ms; /* after reaping */
  uint64_t ended_seq;
  struct proc_sub *subs;
};

void proc_table_init(void);
/* Takes ownership of argv, shell, cwd, tag, env (malloc'd, NULL-terminated arrays). */
struct proc *proc_add(const struct spawn_result *r, int is_pty, uint32_t timeout_ms, char **argv, char *shell,
                      char *cwd, char *tag, char **env);
struct proc *proc_find(pid_t pid);
struct proc *proc_first(void);

/* SIGCHLD: reaps every exited child (ours or orphans). */
void proc_reap_children(void);
void proc_tick(void);
uint64_t proc_next_deadline(void);

/* Streams output from these offsets to s; s->state holds the returned sub. */
struct proc_sub *proc_subscribe(struct proc *p, struct stream *s, uint64_t off_out, uint64_t off_err);
void proc_unsubscribe(struct proc_sub *sub);
/* Sends what the sub's window allows, then EXITED with END once everything is out. */
void proc_sub_pump(struct proc_sub *sub);

/* Queues stdin bytes; the request is answered OK once written. 0 or an errno. */
int proc_stdin_enqueue(struct proc *p, struct stream *s, const uint8_t *data, size_t len, int close_after);
void proc_stdin_forget_stream(struct stdin_req *req);

/* SIGKILL to every running process group: an agent on the host takes its processes
 * with it when it stops (the guest's PID 1 never stops). */
void proc_kill_all(void);

/* exit code as reported: the code, or 128 + signal when killed by one. */
int proc_exit_code(const struct proc *p);
int proc_term_signal(const struct proc *p);

#endif
