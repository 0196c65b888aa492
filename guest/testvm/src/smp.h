/* Application processors: found in the MP table (or given by count), started with
 * INIT-SIPI-SIPI into a real-mode trampoline at AP_TRAMPOLINE, then each counts in its
 * own slot of the status page (cpu_counter[apic id]) with interrupts off. */
#ifndef TESTVM_SMP_H
#define TESTVM_SMP_H

#include <stdint.h>

#define AP_TRAMPOLINE 0x10000u /* below 1 MiB, page aligned, unused by torpor's layout */
#define SMP_MAX_CPUS 8

/* APIC ids of the processors in the MP table (BSP included); 0 when there is none. */
uint32_t smp_mp_table_cpus(uint8_t *apic_ids, uint32_t max);
/* Starts the given APs; returns how many reached ap_main within a second. */
uint32_t smp_start(const uint8_t *apic_ids, uint32_t count);

#endif
