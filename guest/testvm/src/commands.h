/* The command language: one command per line over the serial port, or a comma-
 * separated list in `testvm.run=` (arguments separated by ':' there, since the kernel
 * command line splits on spaces). Every command answers with one result line whose
 * first key is the command's name. README.md lists them. */
#ifndef TESTVM_COMMANDS_H
#define TESTVM_COMMANDS_H

void command_run_line(char *line);
/* Runs `testvm.run=` items in order. */
void command_run_list(const char *list);

#endif
