// The test guest (guest/testvm) under QEMU, without torpor's VMM: proves the guest
// itself (banner, command language, counter, tagged pages, LAPIC timer, virtio-blk,
// virtio-rng, i8042 reset, triple fault) so VMM tests can rely on it. KVM when
// /dev/kvm is usable (on a PVM host that is KVM's instruction emulator), else TCG.
import { spawn, spawnSync, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { accessSync, constants, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { needsCommands, testUnless } from './skip-unless.js';

const QEMU = 'qemu-system-x86_64';
const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..');
const TESTVM = join(ROOT, 'guest/testvm/out/testvm.elf');
const LINE_TIMEOUT_MS = 30_000;

function haveQemu(): boolean {
  return spawnSync(QEMU, ['--version'], { stdio: 'ignore' }).status === 0;
}

function accel(): string {
  try {
    accessSync('/dev/kvm', constants.R_OK | constants.W_OK);
    return 'kvm';
  } catch {
    return 'tcg';
  }
}

/** QEMU microvm's virtio-mmio windows, declared the way torpor's machine declares its own. */
function microvmVirtioCmdline(): string {
  const entries: string[] = [];
  for (let i = 0; i < 8; i++) {
    entries.push(`virtio_mmio.device=512@0x${(0xfeb00000 + i * 0x200).toString(16)}:${5 + i}`);
  }
  return entries.join(' ');
}

/** key=value pairs of one result line. */
function fields(line: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const word of line.trim().split(' ')) {
    const eq = word.indexOf('=');
    if (eq > 0) out[word.slice(0, eq)] = word.slice(eq + 1);
  }
  return out;
}

class Guest {
  private lines: string[] = [];
  private partial = '';
  private waiters: Array<() => void> = [];
  readonly exited: Promise<number | null>;

  private constructor(private readonly proc: ChildProcessWithoutNullStreams) {
    proc.stdout.setEncoding('utf8');
    proc.stdout.on('data', (chunk: string) => {
      const parts = (this.partial + chunk).split('\n');
      this.partial = parts.pop() ?? '';
      for (const p of parts) this.lines.push(p.replace(/\r$/, ''));
      for (const w of this.waiters.splice(0)) w();
    });
    proc.stderr.resume();
    this.exited = new Promise((resolve) => proc.on('exit', (code) => resolve(code)));
  }

  static start(args: string[]): Guest {
    return new Guest(spawn(QEMU, args, { stdio: ['pipe', 'pipe', 'pipe'] }));
  }

  /** Next line (after the ones already taken) that starts with `prefix`. */
  async waitFor(prefix: string, timeoutMs = LINE_TIMEOUT_MS): Promise<string> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const i = this.lines.findIndex((l) => l.startsWith(prefix));
      if (i >= 0) {
        const line = this.lines[i]!;
        this.lines.splice(0, i + 1);
        return line;
      }
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no line starting with "${prefix}" within ${timeoutMs} ms; seen: ${this.lines.join(' | ')}`);
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(t);
          resolve();
        });
      });
    }
  }

  send(line: string): void {
    this.proc.stdin.write(`${line}\n`);
  }

  /** Sends one command line and returns the fields of its result line. */
  async command(line: string): Promise<Record<string, string>> {
    const name = line.split(' ')[0]!;
    this.send(line);
    return fields(await this.waitFor(`${name}=`));
  }

  kill(): void {
    this.proc.kill('SIGKILL');
  }
}

function microvm(append: string, extra: string[] = []): Guest {
  return Guest.start([
    '-accel', accel(), '-cpu', 'qemu64', '-M', 'microvm,ioapic2=off', '-m', '128',
    '-global', 'virtio-mmio.force-legacy=false',
    '-display', 'none', '-monitor', 'none', '-serial', 'stdio', '-no-reboot', '-nodefaults',
    '-kernel', TESTVM, '-append', append, ...extra,
  ]);
}

const skip = !haveQemu() ? `${QEMU} is not installed (apt-get install qemu-system-x86)` : null;
const qemuTest = testUnless('testvm-qemu', skip, 'tools');

test.before(() => {
  if (skip) return;
  const r = spawnSync('make', ['-s', '-C', join(ROOT, 'guest/testvm')], { stdio: 'inherit' });
  assert.is(r.status, 0, 'make -C guest/testvm');
});

qemuTest('testvm boots: banner first, then the boot line', async () => {
  const g = microvm('quiet testvm.run=echo:hello:from:cmdline');
  try {
    await g.waitFor('torpor-testvm ready');
    const boot = fields(await g.waitFor('boot='));
    assert.is(boot.boot, 'ok');
    assert.ok(Number(boot.ram_mib) >= 100, `ram_mib ${boot.ram_mib}`);
    assert.is(fields(await g.waitFor('echo=')).echo, 'hello');
    const info = await g.command('info');
    assert.is(info.status_page, '0x100000');
    assert.match(info.cmdline!, /testvm\.run=echo/);
    g.send('nonsense');
    const unknown = fields(await g.waitFor('error='));
    assert.is(unknown.error, 'unknown-command');
    assert.is(unknown.command, 'nonsense');
  } finally {
    g.kill();
  }
});

qemuTest('testvm counts, tags pages and takes a LAPIC timer interrupt', async () => {
  const g = microvm('x');
  try {
    await g.waitFor('boot=');
    assert.is((await g.command('count start')).running, '1');
    await new Promise((r) => setTimeout(r, 300));
    const a = Number((await g.command('count')).count);
    await new Promise((r) => setTimeout(r, 300));
    const b = Number((await g.command('count')).count);
    assert.ok(b > a && a > 0, `counter advances: ${a} -> ${b}`);
    const stopped = Number((await g.command('count stop')).count);
    const peek = await g.command('peek 0x100008');
    assert.is(Number(peek.peek), stopped % 2 ** 32, 'the counter lives at 0x100008');
    assert.is(Number((await g.command('count')).count), stopped, 'stopped counter stands still');

    const mem = await g.command('mem 0xabc00000 1024');
    assert.equal([mem.mem, mem.pages, mem.bad], ['ok', '1024', '0']);
    const wrong = await g.command('mem-verify 0xabc00001 16');
    assert.equal([wrong['mem-verify'], wrong.bad, wrong.first_bad], ['bad', '16', '0x1000000']);
    assert.is(Number(wrong.seen), (0xabc00000 ^ 0x1000000) >>> 0, 'word = tag XOR address');
    assert.is((await g.command('mem 1 1 0xfff00000')).reason, 'not-ram');

    const timer = await g.command('timer 2000');
    assert.is(timer.timer, 'ok');
    assert.ok(Number((await g.command('irq')).timer) >= 1);
  } finally {
    g.kill();
  }
});

qemuTest('testvm drives virtio-blk and virtio-rng (modern virtio-mmio)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'testvm-'));
  const disk = join(dir, 'disk.img');
  const image = Buffer.alloc(1 << 20);
  image.write('torpor-disk-head', 0, 'latin1');
  writeFileSync(disk, image);
  const g = microvm(microvmVirtioCmdline(), [
    '-drive', `file=${disk},if=none,id=d0,format=raw`, '-device', 'virtio-blk-device,drive=d0',
    '-device', 'virtio-rng-device',
  ]);
  try {
    const boot = fields(await g.waitFor('boot='));
    assert.equal([boot.blk, boot.rng], ['1', '1']);
    assert.is((await g.command('blk')).capacity, '2048');
    const head = await g.command('blk-read 0');
    assert.is(Buffer.from(head.head!, 'hex').toString('latin1'), 'torpor-disk-head');
    const w = await g.command('blk-write 9 0x5eed0000 2');
    assert.is(w['blk-write'], 'ok');
    assert.is((await g.command('blk-verify 9 0x5eed0000 2'))['blk-verify'], 'ok');
    assert.is((await g.command('blk-verify 9 0x5eed0001 2')).bad_words, '256');
    assert.is((await g.command('blk-flush'))['blk-flush'], 'ok');
    const onDisk = readFileSync(disk);
    for (const off of [9 * 512, 9 * 512 + 4, 10 * 512 + 508]) {
      assert.is(onDisk.readUInt32LE(off), (0x5eed0000 ^ off) >>> 0, `disk word at ${off}`);
    }
    const r1 = await g.command('rng 32');
    const r2 = await g.command('rng 32');
    assert.match(r1.rng!, /^[0-9a-f]{64}$/);
    assert.is.not(r1.rng, r2.rng);
    assert.is((await g.command('rng 0')).reason, 'usage');
  } finally {
    g.kill();
    rmSync(dir, { recursive: true, force: true });
  }
});

qemuTest('testvm starts an application processor (INIT-SIPI-SIPI, real-mode trampoline)', async () => {
  const g = microvm('x', ['-smp', '2']);
  try {
    await g.waitFor('boot=');
    const started = await g.command('smp start 2');
    assert.equal([started.smp, started.started, started.alive], ['ok', '1', '1']);
    await new Promise((r) => setTimeout(r, 200));
    const a = Number((await g.command('smp')).cpu1);
    await new Promise((r) => setTimeout(r, 200));
    const b = Number((await g.command('smp')).cpu1);
    assert.ok(b > a && a > 0, `the AP counts: ${a} -> ${b}`);
    assert.is((await g.command('smp stop')).stopped, '1');
  } finally {
    g.kill();
  }
});

testUnless('testvm-qemu', needsCommands('cc'), 'tools')('testvm drivers on the host: vsock and the protocol responder against a fake device', () => {
  // built with ASan/UBSan; the same sources as the guest's (test/fake_device.c plays the device)
  const r = spawnSync('make', ['-s', '-C', join(ROOT, 'guest/testvm'), 'test'], { encoding: 'utf8' });
  if (r.status !== 0) console.log(r.stdout, r.stderr);
  assert.is(r.status, 0, 'make -C guest/testvm test');
  assert.match(r.stdout, /vsock_test: all passed/);
});

qemuTest('testvm ends the machine: i8042 reset and triple fault', async () => {
  for (const cmd of ['reset', 'triple']) {
    // -no-reboot: QEMU exits on a reset request and on a triple fault (shutdown)
    const g = microvm('x', ['-device', 'i8042']);
    try {
      await g.waitFor('boot=');
      assert.is((await g.command(cmd))[cmd], 'now');
      const code = await Promise.race([g.exited, new Promise((r) => setTimeout(() => r('running'), 15_000))]);
      assert.is(code, 0, `${cmd} ends QEMU`);
    } finally {
      g.kill();
    }
  }
});

test.run();
