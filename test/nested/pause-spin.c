// Guest side of test/nested/pause-spin.ts: a thread pinned to vCPU 0 spins (with or without
// PAUSE) on a flag that a thread pinned to vCPU 1 sets after sleeping 200 ms. Under nested TCG
// with one L1 CPU the sleeper wakes only if L1's timer interrupt reaches L1 during the spin.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static atomic_int flag;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static void pin(int cpu) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(cpu, &s); sched_setaffinity(0, sizeof s, &s); }
static void *setter(void *arg) {
  pin(1);
  struct timespec d = {0, 200 * 1000 * 1000};
  nanosleep(&d, 0);
  atomic_store(&flag, 1);
  return arg;
}
int main(int argc, char **argv) {
  int use_pause = argc > 1 && strcmp(argv[1], "pause") == 0;
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  pin(0);
  for (int r = 0; r < rounds; r++) {
    atomic_store(&flag, 0);
    pthread_t t;
    pthread_create(&t, 0, setter, 0);
    double t0 = now();
    unsigned long spins = 0;
    while (!atomic_load_explicit(&flag, memory_order_relaxed)) {
      if (use_pause) __builtin_ia32_pause();
      if ((++spins & 0xffff) == 0 && now() - t0 > 120) break;
    }
    printf("spin %s round %d: %.3f s, %lu spins%s\n", use_pause ? "pause" : "plain", r, now() - t0, spins,
           atomic_load(&flag) ? "" : " GAVE UP");
    fflush(stdout);
    pthread_join(t, 0);
  }
  return 0;
}
