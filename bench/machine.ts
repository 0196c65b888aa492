// The machine a benchmark ran on, recorded in every bench/results/*.json: a figure means
// nothing without it (a PVM host emulates what a hardware host runs natively).
import { existsSync, readFileSync, realpathSync } from 'node:fs';
import { cpus, hostname, loadavg, release, totalmem } from 'node:os';

import { detectHost } from '../lib/setup/host.js';
import { readMountsSync, type Mount } from '../lib/host/mounts.js';
import { torporHome } from '../lib/store/home.js';

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
  /** The filesystem TORPOR_HOME is on (sandbox directories, snapshots, disk tops). */
  home?: HomeFilesystem;
}

export interface HomeFilesystem {
  /** As /proc/self/mountinfo names it (ext4, xfs, tmpfs, ...). */
  type: string;
  /** ext4 only, where /proc/fs/ext4 tells: whether it has a journal (its options name a data=
   *  mode only then). Without one, every inode ext4 allocates skips the inodes deleted in the
   *  last minute or more (its recently_deleted check, which reads each one's deletion time):
   *  creating files right after many were removed, as a bench's rounds do, costs CPU that a
   *  journaled ext4 does not spend. */
  journal?: boolean;
}

/** The filesystem `path` (default TORPOR_HOME, or the nearest directory above it that exists) is
 *  on; undefined where /proc does not say. */
export function homeFilesystem(path = torporHome()): HomeFilesystem | undefined {
  try {
    return filesystemOf(path);
  } catch {
    return undefined; // a record without it, never a failed bench
  }
}

function filesystemOf(path: string): HomeFilesystem | undefined {
  let real = path;
  for (;;) {
    try {
      real = realpathSync(real);
      break;
    } catch {
      const up = real.replace(/\/[^/]*$/, '') || '/';
      if (up === real) return undefined;
      real = up;
    }
  }
  // The deepest mount holding it (the later of two at one point: the one on top).
  let best: Mount | undefined;
  for (const m of readMountsSync()) {
    const inside = m.point === '/' || real === m.point || real.startsWith(m.point + '/');
    if (inside && m.type && (!best || m.point.length >= best.point.length)) best = m;
  }
  if (!best) return undefined;
  if (best.type !== 'ext4') return { type: best.type! };
  // The block device's kernel name (vda, loop0, nvme0n1p2, dm-0), as /proc/fs/ext4 names it.
  let dev: string | undefined;
  try {
    dev = /^DEVNAME=(.+)$/m.exec(readFileSync(`/sys/dev/block/${best.majorMinor}/uevent`, 'utf8'))?.[1];
  } catch {
    // no sysfs entry (btrfs's anonymous devices, a container): journal unknown
  }
  const options = dev ? `/proc/fs/ext4/${dev}/options` : '';
  if (!dev || !existsSync(options)) return { type: 'ext4' };
  return { type: 'ext4', journal: /^data=/m.test(readFileSync(options, 'utf8')) };
}

function withHome(): { home?: HomeFilesystem } {
  const home = homeFilesystem();
  return home ? { home } : {};
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
    ...withHome(),
    ...(loadAtStart === undefined ? {} : { loadAverage: [round(loadAtStart), round(loadavg()[0]!)] as [number, number] }),
  };
}

const round = (x: number) => Math.round(x * 100) / 100;

/** The 1-minute load average now (pass it to machineRecord at the end). */
export const loadNow = (): number => loadavg()[0]!;
