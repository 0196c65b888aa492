/* The agent's C tests' one assertion: CHECK(cond) reports the failed condition with its place
 * and counts it in `failures`; the test ends non-zero when any failed. */
#ifndef AGENT_TEST_CHECK_H
#define AGENT_TEST_CHECK_H

#include <stdio.h>

static int failures;
#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      failures++;                                                              \
    }                                                                          \
  } while (0)

#endif
