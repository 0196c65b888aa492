/* Log lines on stderr ("torpor-agent: ..."). As PID 1, stderr is the console. */
#ifndef AGENT_LOG_H
#define AGENT_LOG_H

void log_set_quiet(int quiet);
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
