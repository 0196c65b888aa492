/* Pseudo-terminals for exec with a pty: one output stream, resizable. */
#ifndef AGENT_PTY_H
#define AGENT_PTY_H

#include <stddef.h>

/* Opens a master (non-blocking, close-on-exec) sized rows x cols and names its slave;
 * returns the master fd or -1 with errno set. */
int pty_open(unsigned rows, unsigned cols, char *slave_path, size_t path_size);
/* In the child: makes the slave the controlling terminal and fds 0-2. -1 on error. */
int pty_attach_slave(const char *slave_path);
int pty_resize(int master, unsigned rows, unsigned cols);

#endif
