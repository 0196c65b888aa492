// What per-thread seccomp costs on the exit path (docs/seccomp.md): the PIO and
// MMIO exit round trips of a guest spinning on one kind of exit, with the
// filters (the default) and without (TORPOR_SECCOMP=off, read when a machine is
// built), alternated round by round so that the load of a shared host falls on
// both alike. Prints a table and writes bench/results/seccomp.json.
//   node --import tsx bench/seccomp.ts [rounds] [seconds per round]
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { MMIO_LOOP, PIO_LOOP, pvhElf32, writeTemp } from '../test/vmm-guests.js';
import { loadNow, machineRecord } from './machine.js';
import { exitLoop } from './vmm.js';

async function roundTripUs(kernel: string, kind: 'pio' | 'mmio', seconds: number, seccomp: boolean): Promise<number> {
  // Read when the machine is built, at the start of exitLoop.
  if (seccomp) delete process.env.TORPOR_SECCOMP;
  else process.env.TORPOR_SECCOMP = 'off';
  try {
    return (await exitLoop(kernel, kind, seconds)).us;
  } finally {
    delete process.env.TORPOR_SECCOMP;
  }
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;

/** Runs the comparison (`argv`: [rounds] [seconds per round]) and writes its JSON. */
export async function main(argv: string[] = []): Promise<void> {
  const rounds = Number(argv[0] ?? 5);
  const load = loadNow();
  const seconds = Number(argv[1] ?? 1);
  const kernels = { pio: writeTemp('pio.elf', pvhElf32(PIO_LOOP)), mmio: writeTemp('mmio.elf', pvhElf32(MMIO_LOOP)) };
  const rows: { exit: string; off_us: number; on_us: number; delta_us: number; rounds: number }[] = [];
  for (const kind of ['pio', 'mmio'] as const) {
    const on: number[] = [];
    const off: number[] = [];
    for (let i = 0; i < rounds; i++) {
      off.push(await roundTripUs(kernels[kind], kind, seconds, false));
      on.push(await roundTripUs(kernels[kind], kind, seconds, true));
    }
    const row = { exit: kind, off_us: median(off), on_us: median(on), delta_us: median(on) - median(off), rounds };
    rows.push(row);
  }
  console.log('exit round trip (median of rounds, us)   seccomp off   seccomp on   delta');
  for (const r of rows)
    console.log(`${r.exit.padEnd(41)} ${r.off_us.toFixed(2).padStart(11)} ${r.on_us.toFixed(2).padStart(12)} ${r.delta_us.toFixed(2).padStart(7)}`);
  const out = join(dirname(fileURLToPath(import.meta.url)), 'results', 'seccomp.json');
  await mkdir(dirname(out), { recursive: true });
  await writeFile(out, JSON.stringify({ bench: 'seccomp', date: new Date().toISOString(), machine: machineRecord(load), rounds, seconds, rows }, null, 2) + '\n');
}

// Runs only when started as a script (`npm run bench` does not import it unless named).
if (process.argv[1] === fileURLToPath(import.meta.url)) await main(process.argv.slice(2));
