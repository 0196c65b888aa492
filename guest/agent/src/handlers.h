/* Request handlers. Each one answers on its stream (or keeps it open to stream data)
 * and never blocks for long: the agent is one event loop. */
#ifndef AGENT_HANDLERS_H
#define AGENT_HANDLERS_H

#include "conn.h"

/* exec.c */
void handle_exec(struct stream *s, const struct frame *f);
void handle_attach(struct stream *s, const struct frame *f);
/* Re-asked EXEC: ATTACH to pid from offset 0 on both streams. */
void exec_attach_pid(struct stream *s, uint32_t pid, uint64_t off_out, uint64_t off_err);
void handle_stdin(struct stream *s, const struct frame *f);
void handle_proc_signal(struct stream *s, const struct frame *f);
void handle_proc_list(struct stream *s, const struct frame *f);
void handle_pty_resize(struct stream *s, const struct frame *f);

/* files.c */
void handle_file_read(struct stream *s, const struct frame *f);
void handle_file_write(struct stream *s, const struct frame *f);
void handle_file_list(struct stream *s, const struct frame *f);
void handle_file_stat(struct stream *s, const struct frame *f);
void handle_mkdir(struct stream *s, const struct frame *f);
void handle_remove(struct stream *s, const struct frame *f);
void handle_rename(struct stream *s, const struct frame *f);

/* lifecycle.c */
void handle_sync(struct stream *s, const struct frame *f);
void handle_poweroff(struct stream *s, const struct frame *f);
void handle_resumed(struct stream *s, const struct frame *f);
void handle_echo(struct stream *s, const struct frame *f);

/* grow.c */
void handle_grow_fs(struct stream *s, const struct frame *f);

/* Field helpers for handlers: a str field as a fresh C string (replacing *dst);
 * -1 when it holds a NUL byte or memory runs out. */
int field_cstr(const struct tp_field *fl, char **dst);

#endif
