// The host's mounts as /proc/self/mountinfo lists them: each line's mount point (the kernel
// escapes space, tab, newline and backslash in it as \ooo), device (major:minor) and type. What
// a build directory's removal checks (nothing mounted inside it) and what a benchmark records
// (the filesystem TORPOR_HOME is on) read.
import { readFileSync } from 'node:fs';
import { readFile } from 'node:fs/promises';

export interface Mount {
  /** The mount point, its escapes decoded. */
  point: string;
  /** The device as major:minor (0:N for a filesystem without a block device). */
  majorMinor: string;
  /** The filesystem type (ext4, tmpfs, ...); undefined on a line cut short. */
  type?: string;
}

/** mountinfo's lines: id parent major:minor root mountpoint options [optional fields] - type source superoptions. */
export function parseMountinfo(text: string): Mount[] {
  const out: Mount[] = [];
  for (const line of text.split('\n')) {
    const [pre, post] = line.split(' - ');
    const f = pre!.split(' ');
    if (f.length < 5) continue;
    const type = post?.split(' ')[0];
    out.push({ point: f[4]!.replace(/\\([0-7]{3})/g, (_m, o: string) => String.fromCharCode(parseInt(o, 8))), majorMinor: f[2]!, ...(type ? { type } : {}) });
  }
  return out;
}

/** This process's mounts; none where /proc cannot be read. */
export async function readMounts(): Promise<Mount[]> {
  return parseMountinfo(await readFile('/proc/self/mountinfo', 'utf8').catch(() => ''));
}

/** readMounts(), synchronously (a benchmark's machine record). */
export function readMountsSync(): Mount[] {
  try {
    return parseMountinfo(readFileSync('/proc/self/mountinfo', 'utf8'));
  } catch {
    return [];
  }
}
