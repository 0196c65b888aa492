// The machine a benchmark ran on, recorded in every bench/results/*.json: a figure means
// nothing without it (a PVM host emulates what a hardware host runs natively).
import { existsSync, readFileSync } from 'node:fs';
import { cpus, hostname, release, totalmem } from 'node:os';

export interface MachineRecord {
  cpu: string;
  cores: number;
  memoryGiB: number;
  kernel: string;
  /** What /dev/kvm is here: hardware virtualization, PVM (KVM without it), or none. */
  kvm: 'hardware' | 'pvm' | 'none';
  node: string;
  hostname: string;
}

export function machineRecord(): MachineRecord {
  const cpuinfo = existsSync('/proc/cpuinfo') ? readFileSync('/proc/cpuinfo', 'utf8') : '';
  const kvm = !existsSync('/dev/kvm') ? 'none' : existsSync('/sys/module/kvm_pvm') ? 'pvm' : /\b(vmx|svm)\b/.test(cpuinfo) ? 'hardware' : 'pvm';
  return {
    cpu: cpus()[0]?.model.trim() ?? 'unknown',
    cores: cpus().length,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    kernel: release(),
    kvm,
    node: process.version,
    hostname: hostname(),
  };
}
