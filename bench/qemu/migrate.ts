// QEMU's save and restore of the test guest, the comparison point for torpor's
// snapshots (issue 7, docs/architecture.md#performance-targets): `qemu-system-x86_64 -M microvm -enable-kvm
// -cpu qemu64` running guest/testvm, the same guest torpor's benchmarks use.
//
// Save: QMP `migrate` to `exec:cat > FILE` (QEMU 7.2 has no `file:` URI), with the
// bandwidth limit lifted, timed from the command to `query-migrate` reporting
// `completed` (the file is in the page cache, not fsynced: compare with torpor's
// captured time plus its write, not with its durable time). Restore: a new QEMU
// process with `-incoming "exec:cat FILE"`, timed from spawn to the guest answering
// a serial command again (QEMU restarts the guest on its own once the stream is in).
import { type ChildProcessWithoutNullStreams, spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const QEMU = 'qemu-system-x86_64';

export function qemuAvailable(): string | null {
  const r = spawnSync(QEMU, ['--version'], { encoding: 'utf8' });
  if (r.status !== 0) return `${QEMU} is not installed (apt-get install qemu-system-x86)`;
  return null;
}

export interface QemuSnapshotTiming {
  memoryMiB: number;
  dirtyPages: number;
  saveMs: number;
  restoreMs: number;       // spawn -> the guest answers a serial command
  restoreRunningMs: number; // spawn -> QMP says `running`
  fileBytes: number;
}

/** A QEMU child with line-split serial output on stdio and a QMP socket. */
class QemuGuest {
  private lines: string[] = [];
  private partial = '';
  private wake: (() => void) | null = null;
  readonly qmpPath: string;
  private qmp: Socket | null = null;
  private qmpBuf = '';
  private qmpWaiters: Array<(msg: Record<string, unknown>) => void> = [];

  constructor(readonly proc: ChildProcessWithoutNullStreams, qmpPath: string) {
    this.qmpPath = qmpPath;
    proc.stdout.setEncoding('utf8');
    proc.stdout.on('data', (chunk: string) => {
      const parts = (this.partial + chunk).split('\n');
      this.partial = parts.pop() ?? '';
      for (const p of parts) this.lines.push(p.replace(/\r$/, ''));
      this.wake?.();
    });
    proc.stderr.resume();
  }

  async waitLine(prefix: string, timeoutMs = 20_000): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const i = this.lines.findIndex((l) => l.startsWith(prefix));
      if (i >= 0) {
        const l = this.lines[i]!;
        this.lines.splice(0, i + 1);
        return l;
      }
      if (Date.now() > deadline) throw new Error(`QEMU: no "${prefix}" line in ${timeoutMs} ms (seen: ${this.lines.slice(-5).join(' | ')})`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, 50);
        this.wake = () => {
          clearTimeout(t);
          this.wake = null;
          resolve();
        };
      });
    }
  }

  send(line: string): void {
    this.proc.stdin.write(`${line}\n`);
  }

  /** Connects to QMP (retrying while QEMU creates the socket) and negotiates capabilities. */
  async qmpOpen(timeoutMs = 10_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        this.qmp = await new Promise<Socket>((resolve, reject) => {
          const s = connect(this.qmpPath);
          s.once('connect', () => resolve(s));
          s.once('error', reject);
        });
        break;
      } catch (err) {
        if (Date.now() > deadline) throw err;
        await new Promise((r) => setTimeout(r, 1));
      }
    }
    this.qmp.setEncoding('utf8');
    this.qmp.on('data', (chunk: string) => {
      this.qmpBuf += chunk;
      let nl: number;
      while ((nl = this.qmpBuf.indexOf('\n')) >= 0) {
        const line = this.qmpBuf.slice(0, nl);
        this.qmpBuf = this.qmpBuf.slice(nl + 1);
        const msg = JSON.parse(line) as Record<string, unknown>;
        if ('return' in msg || 'error' in msg) this.qmpWaiters.shift()?.(msg);
      }
    });
    await this.qmpCmd('qmp_capabilities');
  }

  qmpCmd(execute: string, args?: Record<string, unknown>): Promise<Record<string, unknown>> {
    return new Promise((resolve, reject) => {
      this.qmpWaiters.push((msg) => ('error' in msg ? reject(new Error(`QMP ${execute}: ${JSON.stringify(msg.error)}`)) : resolve(msg)));
      this.qmp!.write(JSON.stringify(args ? { execute, arguments: args } : { execute }) + '\n');
    });
  }

  kill(): void {
    this.qmp?.destroy();
    this.proc.kill('SIGKILL');
  }
}

function startQemu(kernel: string, memoryMiB: number, qmpPath: string, extra: string[] = []): QemuGuest {
  const args = [
    '-accel', 'kvm', '-cpu', 'qemu64', '-M', 'microvm,ioapic2=off', '-m', String(memoryMiB), '-smp', '1',
    '-display', 'none', '-monitor', 'none', '-serial', 'stdio', '-nodefaults', '-no-reboot',
    '-qmp', `unix:${qmpPath},server=on,wait=off`,
    '-kernel', kernel, '-append', 'quiet', ...extra,
  ];
  return new QemuGuest(spawn(QEMU, args, { stdio: ['pipe', 'pipe', 'pipe'] }), qmpPath);
}

/** One save and one restore of the test guest under QEMU after `dirtyPages` tagged pages were written. */
export async function qemuSaveRestore(kernel: string, memoryMiB: number, dirtyPages: number): Promise<QemuSnapshotTiming> {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-qemu-snap-'));
  const file = join(dir, 'state');
  let g = startQemu(kernel, memoryMiB, join(dir, 'qmp-save'));
  try {
    await g.waitLine('boot=ok');
    if (dirtyPages > 0) {
      g.send(`mem-write 0x5a5a0000 ${dirtyPages}`);
      await g.waitLine('mem-write=ok');
    }
    await g.qmpOpen();
    await g.qmpCmd('migrate-set-parameters', { 'max-bandwidth': 1e12, 'downtime-limit': 100000 });
    const t0 = process.hrtime.bigint();
    await g.qmpCmd('migrate', { uri: `exec:cat > ${file}` });
    for (;;) {
      const r = (await g.qmpCmd('query-migrate')).return as { status?: string };
      if (r.status === 'completed') break;
      if (r.status === 'failed' || r.status === 'cancelled') throw new Error(`QEMU migration ${r.status}`);
      await new Promise((res) => setImmediate(res));
    }
    const saveMs = Number(process.hrtime.bigint() - t0) / 1e6;
    g.kill();
    const fileBytes = statSync(file).size;

    const t1 = process.hrtime.bigint();
    g = startQemu(kernel, memoryMiB, join(dir, 'qmp-restore'), ['-incoming', `exec:cat ${file}`]);
    await g.qmpOpen();
    let restoreRunningMs = NaN;
    for (;;) {
      const r = (await g.qmpCmd('query-status')).return as { status?: string };
      if (r.status === 'running') {
        restoreRunningMs = Number(process.hrtime.bigint() - t1) / 1e6;
        break;
      }
      await new Promise((res) => setImmediate(res));
    }
    g.send('echo restored');
    await g.waitLine('echo=restored');
    const restoreMs = Number(process.hrtime.bigint() - t1) / 1e6;
    if (dirtyPages > 0) {
      g.send(`mem-verify 0x5a5a0000 ${dirtyPages}`);
      const v = await g.waitLine('mem-verify=');
      if (!v.startsWith('mem-verify=ok')) throw new Error(`QEMU restore lost guest memory: ${v}`);
    }
    return { memoryMiB, dirtyPages, saveMs, restoreMs, restoreRunningMs, fileBytes };
  } finally {
    g.kill();
    rmSync(dir, { recursive: true, force: true });
  }
}
