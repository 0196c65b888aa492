/* The guest's command line: `testvm.*` options and `virtio_mmio.device=` entries. */
#ifndef TESTVM_CONFIG_H
#define TESTVM_CONFIG_H

#include <stdint.h>

#define MAX_VIRTIO_DEVICES 8
#define MAX_RUN 512

struct virtio_entry {
  uint32_t base;
  uint32_t size;
  uint32_t gsi;
};

struct config {
  int polled;        /* testvm.poll=1: no device or serial interrupts, spin instead */
  int count_at_boot; /* testvm.count=1 */
  int event_idx;     /* testvm.event_idx=0 turns VIRTIO_RING_F_EVENT_IDX off */
  int probe;         /* testvm.probe=N: without cmdline entries, probe N windows */
  int agent_ready;   /* testvm.agent_ready=1: print the agent's readiness line (agent_ready.h) */
  char run[MAX_RUN]; /* testvm.run=a,b:arg,... */
  uint32_t virtio_count;
  struct virtio_entry virtio[MAX_VIRTIO_DEVICES];
  uint32_t bad_entries; /* virtio_mmio.device entries we could not parse */
};

extern struct config config;

void config_parse(const char *cmdline);

#endif
