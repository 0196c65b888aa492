/* A sandbox's own identity in the guest: its hostname, /etc/machine-id and the MAC of its
 * network interface, carried by RESUMED (docs/protocol.md). The host sends them on every
 * start of a sandbox, so that two sandboxes from one template (or the children of one fork)
 * never share them, and a write lost to a crash is made again at the next start: the files
 * are rewritten only where they differ, without fsync. Applying them is best effort: a file
 * that cannot be written (a full or read-only disk) or is not the agent's to rewrite (not a
 * regular file, or an /etc/hosts of 256 KiB or more) is left as it is and named in the note,
 * and the sandbox starts all the same. */
#ifndef AGENT_IDENTITY_H
#define AGENT_IDENTITY_H

#include <stddef.h>
#include <stdint.h>

/* A hostname the agent accepts: one DNS label, 1..63 of [a-z0-9-], no '-' at either end. */
int identity_valid_hostname(const char *h);
/* A machine id as machine-id(5) has it: 32 lowercase hex digits, not all zero. */
int identity_valid_machine_id(const char *id);
/* A MAC an interface can take: unicast, not all zero. */
int identity_valid_mac(const uint8_t mac[6]);

/* /etc/hosts with the 127.0.1.1 line naming `hostname`: `old` (len bytes, or NULL when the
 * file is missing) with its first 127.0.1.1 line replaced, or one added after the last line;
 * a missing file gets the usual three lines. A fresh malloc'd buffer of *out_len bytes (a NUL
 * after them), or NULL (no memory). */
char *identity_hosts_text(const char *old, size_t len, const char *hostname, size_t *out_len);

/* Brings <root>/etc/hostname, the 127.0.1.1 line of <root>/etc/hosts and <root>/etc/machine-id
 * to what is asked (NULL: leave that one alone), each where it differs. Every file is tried;
 * the number left as they were is returned, and the first one's reason is put in note
 * (NUL-terminated, at most size bytes). */
int identity_write_files(const char *root, const char *hostname, const char *machine_id, char *note, size_t size);

#endif
