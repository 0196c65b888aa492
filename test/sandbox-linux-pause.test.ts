// Pause and continue a real Linux sandbox (issue 8's Linux-level scenarios). Runs where a Linux
// guest can boot (a hardware-virtualization host, or the nested host of `npm run test:linux`);
// elsewhere registered as skipped, category linux-guest, with the reason.
import { spawn, spawnSync } from 'node:child_process';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { roundFile } from './fixtures/round-file.js';
import { testUnless } from './skip-unless.js';
import { NESTED } from './bounds.js';
import { nodeArgs } from './child-node.js';

const support = await linuxGuestSupport();
const linuxTest = testUnless('sandbox-linux-pause', support.ok ? null : `this host cannot boot a Linux guest: ${support.reason}`, 'linux-guest');

const BOOT = { boot: { timeoutMs: 180_000 }, memoryMiB: 256, vcpus: 1 };
/** Emulated CPUs in the nested host: the restored guest may take seconds to answer. */
const CONNECT = { restoreTimeoutMs: 120_000, bootTimeoutMs: 180_000 };
/** Pause/connect cycles with file writes and reads between them (issue 8 asks for 50), on every
 *  host, the emulated nested host included. Each cycle reads back every file written since the
 *  previous cycle's pause, and the last one reads them all: every byte checked, without the
 *  reads growing with the square of the cycle count. */
const CYCLES = 50;
/** Child processes SIGKILLed while pausing (issue 12's CI count: 5; TORPOR_KILL_ROUNDS=100 for a long run). */
const KILL_ROUNDS = Number(process.env.TORPOR_KILL_ROUNDS ?? 5);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function child(...args: string[]): Record<string, unknown> {
  const r = spawnSync(process.execPath, nodeArgs('test/fixtures/linux-pause-child.ts', ...args), { encoding: 'utf8', timeout: 300_000 });
  // urandom-exit ends itself with SIGKILL, on purpose.
  if (r.status !== 0 && r.signal !== 'SIGKILL') throw new Error(`child ${args.join(' ')} failed (${r.status} ${r.signal}): ${r.stderr}`);
  return JSON.parse(r.stdout.trim().split('\n').pop()!) as Record<string, unknown>;
}

const APPENDER =
  'import time\nn = 0\nwhile True:\n    with open("/tmp/count.log", "a") as f:\n        f.write(f"{n}\\n")\n    n += 1\n    time.sleep(0.05)\n';

linuxTest('a background python3 appending every 50 ms: pause, continue in a child Node process, same pid, no value missing', async () => {
  const sbx = await Sandbox.create(BOOT);
  const id = sbx.sandboxId;
  try {
    await sbx.files.write('/tmp/appender.py', APPENDER);
    const bg = await sbx.commands.run('python3 /tmp/appender.py', { background: true });
    // python3 takes a while to start in the emulated nested host: wait for its first lines.
    let before = 0;
    for (let i = 0; i < 600 && before < 5; i++) {
      await sleep(100);
      before = Number((await sbx.commands.run('tail -1 /tmp/count.log 2>/dev/null || echo 0')).stdout.trim());
    }
    assert.ok(before > 0, `the appender runs (${before})`);
    // A foreground command in flight when pause() is called finishes first, its output kept.
    const inFlight = sbx.commands.run('sleep 1; echo finished-before-capture');
    await sleep(100);
    await sbx.pause();
    assert.is((await inFlight).stdout, 'finished-before-capture\n');

    const out = child('continue', id, String(bg.pid), '/tmp/count.log') as { first: number; second: number; alive: string; resumedFrom: string; resumeReason: string | null };
    assert.is(out.resumedFrom, 'memory', `resumed from ${out.resumedFrom}: ${out.resumeReason}`);
    assert.is(out.alive, 'alive', 'the same pid runs on');
    assert.ok(out.first >= before, `${out.first} >= ${before}`);
    assert.ok(out.second > out.first, `tail -1 advances in the child (${out.first} -> ${out.second})`);

    const back = await Sandbox.connect(id, CONNECT);
    try {
      const info = await back.getInfo();
      assert.is(info.resumedFrom, 'memory', `resumed from ${info.resumedFrom}: ${info.resumeReason}`);
      await sleep(300);
      const log = (await back.files.read('/tmp/count.log')).trim().split('\n').map(Number);
      // Every value from 0 to the last, once, in order: the paused interval is simply a longer gap in time.
      log.forEach((v, i) => assert.is(v, i, `line ${i}`));
      assert.ok(log.length - 1 > out.second);
      const procs = await back.commands.list();
      assert.ok(procs.some((p) => p.pid === bg.pid), 'commands.list() shows the background process');
    } finally {
      await back.kill();
    }
  } finally {
    await Sandbox.kill(id).catch(() => undefined);
  }
});

linuxTest('the clock is within 1 s of the host after a 5 s pause; /dev/urandom differs between two resumes of one generation', async () => {
  const sbx = await Sandbox.create(BOOT);
  const id = sbx.sandboxId;
  try {
    await sbx.pause();
    await sleep(5000);
    const back = await Sandbox.connect(id, CONNECT);
    const info = await back.getInfo();
    assert.is(info.resumedFrom, 'memory', `resumed from ${info.resumedFrom}: ${info.resumeReason}`);
    const t0 = Date.now();
    const r = await back.commands.run('date +%s%N');
    const t1 = Date.now();
    const guestMs = Number(BigInt(r.stdout.trim()) / 1_000_000n);
    assert.ok(guestMs >= t0 - 1000 && guestMs <= t1 + 1000, `guest ${guestMs}, host ${t0}..${t1}`);
    await back.pause();
    // Two resumes of the same generation (each child exits without pausing).
    const a = child('urandom-exit', id) as { urandom: string; resumedFrom: string; resumeReason: string | null };
    const b = child('urandom-exit', id) as { urandom: string; resumedFrom: string; resumeReason: string | null };
    assert.is(a.resumedFrom, 'memory', `resumed from ${a.resumedFrom}: ${a.resumeReason}`);
    assert.is(b.resumedFrom, 'memory', `resumed from ${b.resumedFrom}: ${b.resumeReason}`);
    assert.match(a.urandom, /^[0-9a-f]{32}$/);
    assert.is.not(a.urandom, b.urandom);
  } finally {
    await Sandbox.kill(id).catch(() => undefined);
  }
});

linuxTest(`a python3 holding state only in memory answers over stdin after resume; files written between ${CYCLES} pause/connect cycles all intact`, async () => {
  const sbx = await Sandbox.create(BOOT);
  const id = sbx.sandboxId;
  try {
    const script = 'import sys\nstate = []\nfor line in sys.stdin:\n    state.append(line.strip())\n    print(len(state), ",".join(state), flush=True)\n';
    await sbx.files.write('/tmp/keeper.py', script);
    const keeper = await sbx.commands.run('python3 -u /tmp/keeper.py', { background: true, stdin: true });
    await keeper.sendStdin('alpha\n');
    for (let i = 0; i < 600 && !keeper.stdout.includes('1 alpha'); i++) await sleep(100);
    assert.match(keeper.stdout, /^1 alpha\n/);
    const written: string[] = [];
    let cur = sbx;
    for (let cycle = 0; cycle < CYCLES; cycle++) {
      const t0 = performance.now();
      const body = `cycle ${cycle} ${'x'.repeat(cycle * 1000)}\n`;
      await cur.files.write(`/home/user/cycle-${cycle}.txt`, body);
      written.push(body);
      await cur.pause();
      cur = await Sandbox.connect(id, CONNECT);
      const info = await cur.getInfo();
      assert.is(info.resumedFrom, 'memory', `cycle ${cycle}: resumed from ${info.resumedFrom}: ${info.resumeReason}`);
      // The file written before this pause and the one before it (it crossed two pauses); all of them at the end.
      const check = cycle === CYCLES - 1 ? written.map((_, j) => j) : [cycle - 1, cycle].filter((j) => j >= 0);
      for (const j of check) assert.is(await cur.files.read(`/home/user/cycle-${j}.txt`), written[j], `cycle ${cycle}: file ${j}`);
      console.log(`cycle ${cycle}: ${Math.round(performance.now() - t0)} ms (write, pause, connect, ${check.length} files read back)`);
    }
    // The same python3, its list still in memory: reattach and feed it one more line.
    const again = await cur.commands.connect(keeper.pid, { fromOffset: 0 });
    await cur.commands.sendStdin(keeper.pid, 'beta\n');
    for (let i = 0; i < 600 && !again.stdout.includes('2 alpha,beta'); i++) await sleep(100);
    assert.is(again.stdout, '1 alpha\n2 alpha,beta\n', 'output replayed from offset 0, no gap, no duplicate');
    await cur.kill();
  } finally {
    await Sandbox.kill(id).catch(() => undefined);
  }
});

linuxTest('an owner SIGKILLed after writing and syncing a file: connect boots the disk it last wrote by default, the file is there; getInfo says so', async () => {
  const sbx = await Sandbox.create(BOOT);
  const id = sbx.sandboxId;
  try {
    await sbx.files.write('/home/user/before.txt', 'before the pause\n');
    await sbx.pause();
    const path = '/home/user/after-connect.txt';
    const c = spawn(process.execPath, nodeArgs('test/fixtures/linux-pause-child.ts', 'write-sync-hold', id, path), { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    c.stdout.on('data', (d: Buffer) => (out += d.toString()));
    c.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const exited = new Promise((r) => c.once('exit', r));
    for (let i = 0; i < 3000 && !out.includes('"written"') && c.exitCode === null; i++) await sleep(100);
    assert.ok(out.includes('"written"'), `the child wrote and synced its file (${out} ${err})`);
    c.kill('SIGKILL');
    await exited;
    const back = await Sandbox.connect(id, CONNECT);
    try {
      const info = await back.getInfo();
      assert.is(info.resumedFrom, 'disk', info.resumeReason);
      assert.is(info.lost, 'processes');
      assert.match(info.resumeReason ?? '', /died: booted the disk its machine last wrote/);
      assert.ok(info.lostInterval);
      assert.is(await back.files.read(path), roundFile(path), 'the file the dead owner synced');
      assert.is(await back.files.read('/home/user/before.txt'), 'before the pause\n');
    } finally {
      await back.kill();
    }
  } finally {
    await Sandbox.kill(id).catch(() => undefined);
  }
});

linuxTest(`SIGKILL of a process pausing a sandbox at random moments (${KILL_ROUNDS} rounds): connect always works, every file synced before the last completed pause intact`, async () => {
  const sbx = await Sandbox.create(BOOT);
  const id = sbx.sandboxId;
  try {
    await sbx.pause();
    /** Files on the last generation known to be complete (a pause that returned, or a generation a connect found). */
    const kept: string[] = [];
    let generation = (await Sandbox.getInfo(id)).generation;
    for (let round = 0; round < KILL_ROUNDS; round++) {
      const path = `/home/user/round-${round}.txt`;
      const c = spawn(process.execPath, nodeArgs('test/fixtures/linux-pause-child.ts', 'write-sync-pause', id, path), { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      c.stdout.on('data', (d: Buffer) => (out += d.toString()));
      c.stderr.on('data', (d: Buffer) => (err += d.toString()));
      const exited = new Promise((r) => c.once('exit', r));
      for (let i = 0; i < 3000 && !out.includes('"pausing"') && c.exitCode === null; i++) await sleep(100);
      assert.ok(out.includes('"pausing"'), `round ${round}: the child wrote and synced its file (${out} ${err})`);
      // A pause takes a few seconds in the emulated nested host, a few ms on hardware.
      const delay = Math.random() * (NESTED ? 6000 : 300);
      await sleep(delay);
      c.kill('SIGKILL');
      await exited;
      const back = await Sandbox.connect(id, CONNECT);
      try {
        const info = await back.getInfo();
        assert.ok(info.generation >= generation, `round ${round}: generation ${info.generation} >= ${generation}`);
        // The child's pause completed (its generation is the one restored or booted): its file is on it.
        if (info.generation > generation) kept.push(path);
        console.log(`round ${round}: killed ${Math.round(delay)} ms into the pause (${out.includes('"paused"') ? 'after it completed' : 'during it'}); resumed from ${info.resumedFrom} generation ${info.generation}${info.resumeReason ? ` (${info.resumeReason})` : ''}`);
        if (out.includes('"paused"')) assert.ok(info.generation > generation, `round ${round}: the completed pause's generation is used`);
        for (const p of kept) assert.is(await back.files.read(p), roundFile(p), `round ${round}: ${p} intact`);
        await back.pause();
        generation = (await Sandbox.getInfo(id)).generation;
      } catch (e) {
        await back.kill().catch(() => undefined);
        throw e;
      }
    }
  } finally {
    await Sandbox.kill(id).catch(() => undefined);
  }
});

test.run();
