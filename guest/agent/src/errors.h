/* Error answers: errno names and the torpor codes of docs/protocol.md. */
#ifndef AGENT_ERRORS_H
#define AGENT_ERRORS_H

#define CODE_FILE_NOT_FOUND "FILE_NOT_FOUND"
#define CODE_PERMISSION_DENIED "PERMISSION_DENIED"
#define CODE_FILE_EXISTS "FILE_EXISTS"
#define CODE_NOT_A_DIRECTORY "NOT_A_DIRECTORY"
#define CODE_IS_A_DIRECTORY "IS_A_DIRECTORY"
#define CODE_NOT_EMPTY "NOT_EMPTY"
#define CODE_OUT_OF_SPACE "OUT_OF_SPACE"
#define CODE_INVALID_ARGUMENT "INVALID_ARGUMENT"
#define CODE_PROCESS_NOT_FOUND "PROCESS_NOT_FOUND"
#define CODE_OUTPUT_LOST "OUTPUT_LOST"
#define CODE_PROTOCOL_ERROR "PROTOCOL_ERROR"
#define CODE_REQUEST_FAILED "REQUEST_FAILED"

/* "ENOENT", ...; "E<number>" for the rare ones without a name here. */
const char *errno_name(int err);
/* The torpor code for an errno (REQUEST_FAILED when none fits). */
const char *errno_code(int err);

#endif
