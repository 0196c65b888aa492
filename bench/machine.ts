// The machine a benchmark ran on, recorded in every bench/results/*.json: a figure means
// nothing without it (a PVM host emulates what a hardware host runs natively).
import { existsSync, readFileSync } from 'node:fs';
import { cpus, hostname, loadavg, release, totalmem } from 'node:os';

import { detectHost } from '../lib/setup/host.js';

export interface MachineRecord {
  cpu: string;
  cores: number;
  memoryGiB: number;
  kernel: string;
  /** What /dev/kvm is here (lib/setup/host.ts decides): hardware virtualization, by its CPU flag
   *  (Intel vmx, AMD svm) where cpuinfo shows it, PVM (KVM without it), or none. */
  kvm: 'vmx' | 'svm' | 'hardware' | 'pvm' | 'none';
  node: string;
  hostname: string;
  /** The 1-minute load average when the bench started and when it ended: other work on the
   *  machine (a 2-core host shared with builds) moves every figure. */
  loadAverage?: [number, number];
}

export function machineRecord(loadAtStart?: number): MachineRecord {
  const cpuinfo = existsSync('/proc/cpuinfo') ? readFileSync('/proc/cpuinfo', 'utf8') : '';
  const flag = /^flags\s*:.*\b(vmx|svm)\b/m.exec(cpuinfo)?.[1] as 'vmx' | 'svm' | undefined;
  const host = detectHost();
  const kvm = !host.kvm ? 'none' : host.kind === 'pvm' ? 'pvm' : (flag ?? 'hardware');
  return {
    cpu: cpus()[0]?.model.trim() ?? 'unknown',
    cores: cpus().length,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    kernel: release(),
    kvm,
    node: process.version,
    hostname: hostname(),
    ...(loadAtStart === undefined ? {} : { loadAverage: [round(loadAtStart), round(loadavg()[0]!)] as [number, number] }),
  };
}

const round = (x: number) => Math.round(x * 100) / 100;

/** The 1-minute load average now (pass it to machineRecord at the end). */
export const loadNow = (): number => loadavg()[0]!;
