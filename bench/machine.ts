// The machine a benchmark ran on, recorded in every bench/results/*.json: a figure means
// nothing without it (a PVM host emulates what a hardware host runs natively).
import { existsSync, readdirSync, readFileSync, realpathSync } from 'node:fs';
import { cpus, hostname, loadavg, release, totalmem } from 'node:os';

import { detectHost } from '../lib/setup/host.js';
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
  /** ext4 only: whether it has a journal (a jbd2 entry under /proc/fs/jbd2). Without one, every
   *  inode ext4 allocates skips the inodes deleted in the last minute or more (its
   *  recently_deleted check, which reads each one's deletion time): creating files right after
   *  many were removed, as a bench's rounds do, costs CPU that a journaled ext4 does not spend. */
  journal?: boolean;
}

/** The filesystem `path` (default TORPOR_HOME, or the nearest directory above it that exists) is on. */
export function homeFilesystem(path = torporHome()): HomeFilesystem | undefined {
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
  let best: { point: string; type: string; source: string; majorMinor: string } | undefined;
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    // id parent major:minor root mountpoint options ... - type source superoptions
    const [pre, post] = line.split(' - ');
    const f = pre?.split(' ');
    const g = post?.split(' ');
    if (!f || !g || f.length < 5 || g.length < 2) continue;
    const point = f[4]!.replace(/\\040/g, ' ');
    const inside = point === '/' || real === point || real.startsWith(point + '/');
    if (inside && (!best || point.length >= best.point.length)) best = { point, type: g[0]!, source: g[1]!, majorMinor: f[2]! };
  }
  if (!best) return undefined;
  if (best.type !== 'ext4') return { type: best.type };
  // The block device's kernel name (vda, loop0, nvme0n1p2): jbd2 names its journal <name>-8.
  let dev = best.source.replace(/^\/dev\//, '');
  try {
    const uevent = readFileSync(`/sys/dev/block/${best.majorMinor}/uevent`, 'utf8');
    dev = /^DEVNAME=(.+)$/m.exec(uevent)?.[1] ?? dev;
  } catch {
    // no sysfs entry: the mount's source name
  }
  const journals = existsSync('/proc/fs/jbd2') ? readdirSync('/proc/fs/jbd2') : [];
  return { type: 'ext4', journal: journals.some((j) => j.startsWith(`${dev}-`)) };
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

function withHome(): { home?: HomeFilesystem } {
  const home = homeFilesystem();
  return home ? { home } : {};
}

const round = (x: number) => Math.round(x * 100) / 100;

/** The 1-minute load average now (pass it to machineRecord at the end). */
export const loadNow = (): number => loadavg()[0]!;
