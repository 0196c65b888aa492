/* Command line of torpor-agent (documented in guest/agent/README.md; keep it stable). */
#ifndef AGENT_ARGS_H
#define AGENT_ARGS_H

enum listen_kind { LISTEN_VSOCK, LISTEN_UNIX };

struct agent_options {
  enum listen_kind listen_kind;
  unsigned vsock_port;
  const char *unix_path;
  const char *listen_spec; /* as given, for the readiness line */
  int init;                /* do the init duties (PID 1 implies it) */
  int subreaper;
  int is_pid1;
  const char *hostname;
  const char *console; /* "-" = stdout */
  int quiet;
  const char *user; /* default user of requests; NULL: the agent's own (see users.h) */
};

enum args_result { ARGS_OK, ARGS_EXIT_OK, ARGS_USAGE };

/* Fills *o; ARGS_EXIT_OK after --help/--version (already printed), ARGS_USAGE on a bad
 * command line (message and usage already on stderr). */
enum args_result args_parse(int argc, char **argv, struct agent_options *o);

/* "0.1.0": the agent's own version, sent in HELLO. */
const char *agent_version(void);

#endif
