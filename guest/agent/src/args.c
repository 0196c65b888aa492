#include "args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define AGENT_VERSION "0.1.0"

static const char usage[] =
    "usage: torpor-agent [--listen ADDR] [--init] [--subreaper] [--hostname NAME]\n"
    "                    [--console PATH] [--user NAME] [--quiet] [--help] [--version]\n"
    "  --listen unix:/path | vsock:PORT   where to serve the protocol (default vsock:1024)\n"
    "  --init          do the init duties even when not PID 1\n"
    "  --subreaper     reap orphaned descendants (prctl PR_SET_CHILD_SUBREAPER)\n"
    "  --hostname NAME hostname set by the init duties (default torpor)\n"
    "  --console PATH  where the readiness line goes ('-' = stdout)\n"
    "  --user NAME     default user of commands and file requests (as PID 1: 'user' when\n"
    "                  the image has that account; otherwise the agent's own)\n"
    "  --quiet         log errors only\n";

static enum args_result bad(const char *what, const char *arg) {
  fprintf(stderr, "torpor-agent: %s%s%s\n%s", what, arg ? ": " : "", arg ? arg : "", usage);
  return ARGS_USAGE;
}

static int parse_listen(const char *s, struct agent_options *o) {
  if (strncmp(s, "unix:", 5) == 0) {
    const char *path = s + 5;
    if (!*path || strlen(path) >= 108) return -1; /* sun_path holds 108 bytes */
    o->listen_kind = LISTEN_UNIX;
    o->unix_path = path;
  } else if (strncmp(s, "vsock:", 6) == 0) {
    char *end = NULL;
    const char *num = s + 6;
    if (*num < '0' || *num > '9') return -1;
    unsigned long port = strtoul(num, &end, 10);
    if (*end || port == 0 || port > 0xffffffffUL - 1) return -1;
    o->listen_kind = LISTEN_VSOCK;
    o->vsock_port = (unsigned)port;
  } else {
    return -1;
  }
  o->listen_spec = s;
  return 0;
}

enum args_result args_parse(int argc, char **argv, struct agent_options *o) {
  memset(o, 0, sizeof *o);
  o->is_pid1 = getpid() == 1;
  o->listen_kind = LISTEN_VSOCK;
  o->vsock_port = 1024;
  o->listen_spec = "vsock:1024";
  o->hostname = "torpor";
  o->console = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    /* The kernel passes its unknown command-line words to init as arguments; as PID 1
     * those are not ours to refuse. */
    const int takes_value = !strcmp(a, "--listen") || !strcmp(a, "--hostname") || !strcmp(a, "--console") ||
                            !strcmp(a, "--user");
    if (takes_value) {
      if (i + 1 >= argc) return bad("option needs a value", a);
      const char *v = argv[++i];
      if (!strcmp(a, "--listen")) {
        if (parse_listen(v, o) != 0) return bad("bad --listen address (unix:/path or vsock:PORT)", v);
      } else if (!strcmp(a, "--user")) {
        if (!*v || strlen(v) > 255) return bad("bad --user", v);
        o->user = v;
      } else if (!strcmp(a, "--hostname")) {
        if (!*v || strlen(v) > 64) return bad("bad --hostname", v);
        o->hostname = v;
      } else {
        if (!*v) return bad("bad --console", v);
        o->console = v;
      }
    } else if (!strcmp(a, "--init")) {
      o->init = 1;
    } else if (!strcmp(a, "--subreaper")) {
      o->subreaper = 1;
    } else if (!strcmp(a, "--quiet")) {
      o->quiet = 1;
    } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      fputs(usage, stdout);
      return ARGS_EXIT_OK;
    } else if (!strcmp(a, "--version")) {
      puts("torpor-agent " AGENT_VERSION " protocol v1");
      return ARGS_EXIT_OK;
    } else if (o->is_pid1) {
      continue; /* see above: kernel leftovers */
    } else {
      return bad("unknown argument", a);
    }
  }
  if (o->is_pid1) o->init = 1;
  if (o->init && !o->is_pid1) o->subreaper = 1;
  if (!o->console) o->console = o->is_pid1 ? "/dev/console" : "-";
  return ARGS_OK;
}

const char *agent_version(void) { return AGENT_VERSION; }
