// The guest agent's process-level duties, run on the host against the real binary:
// its command line, the readiness line, reaping orphans as a subreaper, and the init
// duties as PID 1 of a PID namespace (hostname, reaping, poweroff = the namespace ends).
import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { FieldWriter, Fields } from '../lib/agent/fields.js';
import { encodeFrame, FrameDecoder, type Frame } from '../lib/agent/frame.js';
import { FLAG_END, FrameType } from '../lib/agent/protocol.js';
import { testUnless } from './skip-unless.js';

const AGENT = join(process.cwd(), 'guest/agent/out/torpor-agent');
// Not under /tmp or /run: with --init the agent mounts fresh tmpfs there (in its own
// mount namespace), which would hide a socket from the test.
const WORK = mkdtempSync('/var/tmp/torpor-agent-init-');

test.before(() => {
  execFileSync('make', ['-s', '-C', 'guest/agent'], { stdio: 'inherit' });
});

test.after(() => {
  rmSync(WORK, { recursive: true, force: true });
});

/** Runs the agent with args, returns exit code and output (for flag checks). */
function runAgent(args: string[]): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(AGENT, args, { encoding: 'utf8', timeout: 5000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Starts a long-running command and resolves with its first stdout line. */
function startAndReadLine(cmd: string, args: string[]): Promise<{ child: ChildProcess; line: string }> {
  const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  return new Promise((resolve, reject) => {
    let out = '';
    let err = '';
    const timer = setTimeout(() => reject(new Error(`no readiness line; stderr: ${err}`)), 5000);
    child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const nl = out.indexOf('\n');
      if (nl >= 0) {
        clearTimeout(timer);
        resolve({ child, line: out.slice(0, nl) });
      }
    });
    child.on('exit', (code) => reject(new Error(`exited ${code} before ready; stderr: ${err}`)));
  });
}

function exited(child: ChildProcess, timeoutMs = 5000): Promise<number | null> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('process did not exit')), timeoutMs);
    child.once('exit', (code) => {
      clearTimeout(t);
      resolve(code);
    });
  });
}

/** A bare protocol connection: HELLO, then requests answered frame by frame. */
class Conn {
  private decoder = new FrameDecoder();
  private frames: Frame[] = [];
  private waiters: (() => void)[] = [];
  private nextStream = 1;
  private nextId = 1n;
  closed = false;

  private constructor(private sock: Socket) {
    sock.on('data', (d: Buffer) => {
      this.frames.push(...this.decoder.push(d));
      this.wake();
    });
    sock.on('close', () => {
      this.closed = true;
      this.wake();
    });
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  static async open(path: string): Promise<Conn> {
    const sock = connect(path);
    await new Promise<void>((res, rej) => sock.once('connect', res).once('error', rej));
    const c = new Conn(sock);
    c.sock.write(encodeFrame(0, FrameType.HELLO, 0, new FieldWriter().u32('version', 1).u64('features', 63n).str('name', 'agent-init.test').toBuffer()));
    const hello = await c.next((f) => f.stream === 0);
    assert.is(hello.type, FrameType.HELLO);
    return c;
  }

  async next(match: (f: Frame) => boolean, timeoutMs = 10000): Promise<Frame> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const i = this.frames.findIndex(match);
      if (i >= 0) return this.frames.splice(i, 1)[0]!;
      if (this.closed) throw new Error('connection closed');
      if (Date.now() > end) throw new Error('timed out waiting for a frame');
      await new Promise<void>((res) => {
        this.waiters.push(res);
        setTimeout(res, 100);
      });
    }
  }

  request(type: number, fields: FieldWriter, flags = 0): number {
    const stream = this.nextStream;
    this.nextStream += 2;
    fields.u64('request_id', this.nextId++);
    this.sock.write(encodeFrame(stream, type, flags, fields.toBuffer()));
    return stream;
  }

  /** Runs argv to its end: stdout text and exit code. */
  async exec(argv: string[]): Promise<{ pid: number; stdout: string; exitCode: number }> {
    const w = new FieldWriter();
    for (const a of argv) w.str('arg', a);
    const stream = this.request(FrameType.EXEC, w);
    const started = await this.next((f) => f.stream === stream);
    assert.is(started.type, FrameType.STARTED, 'STARTED');
    const pid = Fields.parse(started.payload).u32('pid')!;
    let stdout = '';
    for (;;) {
      const f = await this.next((x) => x.stream === stream);
      if (f.type === FrameType.STDOUT) stdout += Fields.parse(f.payload).bytes('data')!.toString();
      if (f.type === FrameType.EXITED) return { pid, stdout, exitCode: Fields.parse(f.payload).i32('exit_code')! };
    }
  }

  close(): void {
    this.sock.destroy();
  }
}

/** Zombie children of pid, from /proc. */
function zombieChildren(pid: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const status = readFileSync(`/proc/${name}/status`, 'utf8');
      const ppid = Number(/^PPid:\s+(\d+)/m.exec(status)?.[1]);
      const state = /^State:\s+(\S)/m.exec(status)?.[1];
      if (ppid === pid && state === 'Z') out.push(Number(name));
    } catch {
      // raced with its exit
    }
  }
  return out;
}

function parentOf(pid: number): number | undefined {
  try {
    return Number(/^PPid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]);
  } catch {
    return undefined;
  }
}

test('bad flags print the usage and exit with code 2', () => {
  for (const args of [['--bogus'], ['--listen'], ['--listen', 'tcp:1234'], ['--listen', 'vsock:'], ['--listen', 'unix:'], ['--hostname'], ['stray']]) {
    const r = runAgent(args);
    assert.is(r.status, 2, `exit code for ${args.join(' ')}`);
    assert.match(r.stderr, /usage: torpor-agent/, `usage for ${args.join(' ')}`);
  }
});

test('--help and --version exit 0', () => {
  const help = runAgent(['--help']);
  assert.is(help.status, 0);
  assert.match(help.stdout, /--listen unix:\/path \| vsock:PORT/);
  const version = runAgent(['--version']);
  assert.is(version.status, 0);
  assert.match(version.stdout, /^torpor-agent \d+\.\d+\.\d+ protocol v1/);
});

test('one readiness line once listening; SIGTERM stops it and removes the socket', async () => {
  const sock = join(WORK, 'ready.sock');
  const { child, line } = await startAndReadLine(AGENT, ['--listen', `unix:${sock}`, '--quiet']);
  try {
    assert.match(line, new RegExp(`^torpor-agent ready v1 \\d+ unix:${sock}$`));
    const c = await Conn.open(sock); // listening already when the line came out
    c.close();
  } finally {
    child.kill('SIGTERM');
  }
  assert.is(await exited(child), 0);
  assert.not.ok(existsSync(sock), 'socket file removed');
});

test('an agent on the host takes its running processes with it when stopped', async () => {
  const sock = join(WORK, 'stop.sock');
  const { child } = await startAndReadLine(AGENT, ['--listen', `unix:${sock}`, '--quiet']);
  const c = await Conn.open(sock);
  const stream = c.request(FrameType.EXEC, new FieldWriter().str('arg', 'sleep').str('arg', '30'));
  const started = await c.next((f) => f.stream === stream);
  assert.is(started.type, FrameType.STARTED);
  const pid = Fields.parse(started.payload).u32('pid')!;
  assert.ok(existsSync(`/proc/${pid}`), 'sleep is running');
  c.close();
  child.kill('SIGTERM');
  assert.is(await exited(child), 0);
  const deadline = Date.now() + 3000;
  // Killed, then reaped by whoever inherits it; a zombie would still show its /proc entry.
  while (existsSync(`/proc/${pid}`) && Date.now() < deadline) await new Promise((res) => setTimeout(res, 20));
  assert.not.ok(existsSync(`/proc/${pid}`), 'sleep was killed with the agent');
});

test('as a subreaper the agent reaps an orphaned grandchild (no zombie left)', async () => {
  const sock = join(WORK, 'reaper.sock');
  const { child } = await startAndReadLine(AGENT, ['--listen', `unix:${sock}`, '--subreaper', '--quiet']);
  const agentPid = child.pid!;
  const c = await Conn.open(sock);
  try {
    // The shell starts a background sleep and exits at once: the sleep is orphaned and,
    // with the agent a subreaper, re-parented to the agent instead of to init.
    const r = await c.exec(['/bin/sh', '-c', 'sleep 0.5 & echo $!']);
    assert.is(r.exitCode, 0);
    const orphan = Number(r.stdout.trim());
    assert.ok(orphan > 0, 'orphan pid printed');
    assert.is(parentOf(orphan), agentPid, 'the orphan now belongs to the agent');
    const deadline = Date.now() + 5000;
    while (existsSync(`/proc/${orphan}`) && Date.now() < deadline) await new Promise((res) => setTimeout(res, 50));
    assert.not.ok(existsSync(`/proc/${orphan}`), 'orphan reaped (a zombie would still be in /proc)');
    assert.equal(zombieChildren(agentPid), [], 'no zombie children of the agent');
  } finally {
    c.close();
    child.kill('SIGTERM');
    await exited(child);
  }
});

test('--init in the host namespaces neither mounts nor renames the host', async () => {
  const before = execFileSync('hostname', { encoding: 'utf8' });
  const sock = join(WORK, 'hostinit.sock');
  const child = spawn(AGENT, ['--init', '--listen', `unix:${sock}`, '--hostname', 'must-not-happen'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  await new Promise<void>((res) => child.stdout!.once('data', () => res()));
  child.kill('SIGTERM');
  await exited(child);
  assert.is(execFileSync('hostname', { encoding: 'utf8' }), before);
  assert.match(err, /mounts skipped/);
  assert.match(err, /hostname left alone/);
});

/** Why `unshare` with these namespaces cannot run here, or null. */
function unshareSkipReason(args: string[]): string | null {
  const probe = spawnSync('unshare', [...args, 'true'], { timeout: 5000 });
  return probe.status === 0 ? null : `unshare ${args.join(' ')} is not permitted on this host (needs root)`;
}

testUnless('agent-init', unshareSkipReason(['--mount', '--uts']), 'root')('--init in namespaces of its own (not PID 1): hostname set, subreaper implied', async () => {
  const sock = join(WORK, 'nsinit.sock');
  const { child } = await startAndReadLine('unshare', [
    '--mount', '--uts', AGENT, '--init', '--listen', `unix:${sock}`, '--hostname', 'torpor-ns-test', '--quiet',
  ]);
  const c = await Conn.open(sock);
  try {
    assert.is((await c.exec(['/bin/hostname'])).stdout.trim(), 'torpor-ns-test');
    const r = await c.exec(['/bin/sh', '-c', 'sleep 1 >/dev/null 2>&1 & echo $!']);
    assert.is(parentOf(Number(r.stdout.trim())), child.pid, 'orphan re-parented to the agent (subreaper)');
  } finally {
    c.close();
    child.kill('SIGTERM');
    await exited(child);
  }
});

testUnless('agent-init', unshareSkipReason(['--fork', '--pid', '--mount', '--uts', '--kill-child']), 'root')('init duties as PID 1 of a PID namespace: hostname, reaping, poweroff ends it', async () => {
  const sock = join(WORK, 'init.sock');
  const { child } = await startAndReadLine('unshare', [
    '--fork', '--pid', '--mount', '--uts', '--kill-child',
    AGENT, '--listen', `unix:${sock}`, '--hostname', 'torpor-init-test', '--console', '-', '--quiet',
  ]);
  const c = await Conn.open(sock);
  try {
    // PID 1 implies --init: the hostname is set (in the namespace only).
    const host = await c.exec(['/bin/hostname']);
    assert.is(host.stdout.trim(), 'torpor-init-test');
    // Our own children see the agent, PID 1, as their parent.
    const ppid = await c.exec(['/bin/sh', '-c', 'echo $PPID']);
    assert.is(ppid.stdout.trim(), '1');
    // An orphan lands on PID 1 (the agent) and is reaped by it.
    const orphan = await c.exec(['/bin/sh', '-c', 'sleep 0.3 & echo $!']);
    const inner = Number(orphan.stdout.trim());
    await new Promise((res) => setTimeout(res, 600));
    const ps = await c.exec(['/bin/sh', '-c', `test -d /proc/${inner} && cat /proc/${inner}/stat || echo gone`]);
    // /proc is the host's here (already a mount point, so left alone), so look up by host pid too.
    assert.ok(ps.stdout.includes('gone') || !/ Z /.test(ps.stdout), `orphan ${inner} reaped: ${ps.stdout}`);
    // POWEROFF: OK first, then reboot(2), which in a PID namespace ends the namespace.
    const s = c.request(FrameType.POWEROFF, new FieldWriter());
    const ok = await c.next((f) => f.stream === s);
    assert.is(ok.type, FrameType.OK);
    assert.ok(ok.flags & FLAG_END);
    await exited(child, 5000);
  } finally {
    c.close();
    child.kill('SIGTERM');
  }
});

testUnless('agent-init', unshareSkipReason(['--fork', '--pid', '--mount', '--kill-child']), 'root')("as PID 1, the image's `user` account is the default user: commands run as it, in its home", async () => {
  // The namespace's own /etc/passwd (a bind mount) has the account torpor's image has.
  // Reachable for uid 1000 (WORK is 0700), and not under /tmp, which PID 1 mounts afresh.
  const home = mkdtempSync('/var/tmp/torpor-home-user-');
  execFileSync('chown', ['1000:1000', home]);
  const passwd = join(WORK, 'passwd');
  writeFileSync(passwd, readFileSync('/etc/passwd', 'utf8').split('\n').filter((l) => !l.startsWith('user:')).join('\n') + `user:x:1000:1000::${home}:/bin/sh\n`);
  const sock = join(WORK, 'user.sock');
  const { child } = await startAndReadLine('unshare', [
    '--fork', '--pid', '--mount', '--kill-child', '/bin/sh', '-c',
    `mount --bind ${passwd} /etc/passwd && exec ${AGENT} --listen unix:${sock} --console - --quiet`,
  ]);
  const c = await Conn.open(sock);
  try {
    const r = await c.exec(['/bin/sh', '-c', 'id -u; id -g; pwd; echo $HOME $USER']);
    assert.is(r.stdout, `1000\n1000\n${home}\n${home} user\n`);
  } finally {
    c.close();
    child.kill('SIGKILL'); // PID 1 ignores SIGTERM; --kill-child takes the agent along
    rmSync(home, { recursive: true, force: true });
  }
});

test('--user needs a name', () => {
  const r = runAgent(['--user', '']);
  assert.is(r.status, 2);
});

/** Our guest kernel (guest/kernel, built by `torpor setup`) if it was built, else undefined. */
function ourKernel(): string | undefined {
  const home = process.env.TORPOR_HOME ?? join(process.env.HOME ?? '/root', '.local/share/torpor');
  const dir = join(home, 'artifacts', 'kernel');
  if (!existsSync(dir)) return undefined;
  const found = readdirSync(dir)
    .map((key) => join(dir, key, 'vmlinux'))
    .filter((p) => existsSync(p));
  return found[0];
}

function onPath(tool: string): boolean {
  return spawnSync('sh', ['-c', `command -v ${tool}`]).status === 0;
}

const builtKernel = ourKernel();
const pid1Test = testUnless(
  'agent-init',
  !builtKernel ? 'needs our guest kernel (torpor setup)' : ['qemu-system-x86_64', 'mkfs.ext4'].some((t) => !onPath(t)) ? 'needs qemu-system-x86_64 and mkfs.ext4' : null,
  builtKernel ? 'tools' : 'artifacts',
);

pid1Test('the static agent boots as real PID 1 of our kernel (QEMU, TCG): readiness, no errors', async () => {
  const kernel = builtKernel!;
  // A root filesystem holding nothing but the agent as /init.
  const tree = join(WORK, 'rootfs');
  for (const d of ['dev', 'proc', 'sys', 'tmp', 'run']) execFileSync('mkdir', ['-p', join(tree, d)]);
  execFileSync('cp', [join(process.cwd(), 'guest/agent/out/torpor-agent-static'), join(tree, 'init')]);
  const image = join(WORK, 'root.img');
  execFileSync('truncate', ['-s', '16M', image]);
  execFileSync('mkfs.ext4', ['-q', '-F', '-d', tree, image]);
  // TCG, not KVM: on a PVM host our kernel cannot run under KVM, and TCG runs anywhere.
  const qemu = spawn('qemu-system-x86_64', [
    '-M', 'microvm,acpi=off', '-accel', 'tcg', '-nodefaults', '-no-user-config', '-nographic',
    '-serial', 'stdio', '-m', '256', '-no-reboot', '-kernel', kernel,
    '-append', 'console=ttyS0 root=/dev/vda rw init=/init panic=-1 quiet --hostname pid1-test',
    '-drive', `id=d,file=${image},format=raw,if=none`, '-device', 'virtio-blk-device,drive=d',
  ], { stdio: ['ignore', 'pipe', 'pipe'] });
  let serial = '';
  try {
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no readiness line in 60 s; console:\n${serial}`)), 60000);
      qemu.stdout!.on('data', (d: Buffer) => {
        serial += d.toString();
        if (/torpor-agent ready v1 \d+ vsock:1024/.test(serial) || /Kernel panic/.test(serial)) {
          clearTimeout(timer);
          resolve();
        }
      });
      qemu.on('exit', () => {
        clearTimeout(timer);
        reject(new Error(`qemu exited; console:\n${serial}`));
      });
    });
  } finally {
    qemu.kill('SIGKILL');
  }
  assert.not.match(serial, /Kernel panic/);
  assert.not.match(serial, /torpor-agent: error/, 'every mount and the hostname succeeded');
  assert.is(serial.match(/torpor-agent ready/g)?.length, 1, 'exactly one readiness line');
});

test.run();
