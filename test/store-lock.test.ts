// The owner lock (lib/store/lock.ts over native/base/file_lock.h): exclusive
// between processes and inside one, free at once when its holder is SIGKILLed
// (even while a child it spawned lives on: the fd is O_CLOEXEC), no handle on
// the event loop, the holder's pid readable by whoever is refused.
import { spawn, spawnSync, type ChildProcessByStdio } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { acquireLock, tryLock } from '../lib/store/lock.js';
import { takeOwnerLock } from '../lib/store/owner-lock.js';

const fixture = join(import.meta.dirname, 'fixtures', 'lock-holder.ts');

type Holder = ChildProcessByStdio<Writable, Readable, null>;

function holder(mode: string, path: string): Holder {
  return spawn(process.execPath, ['--import', 'tsx', fixture, mode, path], { stdio: ['pipe', 'pipe', 'inherit'] });
}

/** The next stdout line that starts with `prefix`. */
function line(child: Holder, prefix: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = '';
    const onData = (d: Buffer): void => {
      text += d.toString();
      const found = text.split('\n').find((l) => l.startsWith(prefix));
      if (found) {
        child.stdout.off('data', onData);
        resolve(found);
      }
    };
    child.stdout.on('data', onData);
    child.once('exit', (code, signal) => reject(new Error(`holder exited (${code ?? signal}) before "${prefix}"; stdout: ${text}`)));
  });
}

function exited(child: Holder): Promise<number | null> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve(child.exitCode);
    else child.once('exit', (code) => resolve(code));
  });
}

async function withDir(f: (dir: string) => Promise<void>): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-lock-test-'));
  try {
    await f(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

test('two processes contend: the second is refused with the holder pid, waits, and gets it on release', () =>
  withDir(async (dir) => {
    const path = join(dir, 'a.lock');
    const child = holder('hold', path);
    try {
      const pid = Number((await line(child, 'locked ')).split(' ')[1]);
      assert.is(pid, child.pid);
      assert.is(await readFile(path, 'utf8'), `${pid}\n`, 'the holder wrote its pid');
      const refused = tryLock(path);
      assert.equal(refused, { ok: false, ownerPid: pid });

      let noticedPid: number | undefined;
      const err = await acquireLock(path, { timeoutMs: 150, waitNoticeMs: 20, onWait: (p) => (noticedPid = p) }).catch((e: unknown) => e);
      assert.instance(err, TorporError);
      assert.is((err as TorporError).code, 'TIMEOUT');
      assert.match((err as TorporError).message, `held by pid ${pid}`);
      assert.is(noticedPid, pid, 'onWait named the holder');

      const waiting = acquireLock(path);
      child.stdin.write('release\n');
      await line(child, 'released');
      const lock = await waiting;
      assert.is(await readFile(path, 'utf8'), `${process.pid}\n`, 'the new holder wrote its pid');
      await lock.release();
      await lock.release(); // idempotent
    } finally {
      child.kill('SIGKILL');
      await exited(child);
    }
  }),
);

test('a SIGKILLed holder frees the lock at once, though a child it spawned lives on (O_CLOEXEC)', () =>
  withDir(async (dir) => {
    const path = join(dir, 'b.lock');
    const child = holder('spawn-and-hold', path);
    let sleeper = 0;
    try {
      const [, pid, sleepPid] = (await line(child, 'locked ')).split(' ');
      sleeper = Number(sleepPid);
      const busy = tryLock(path);
      assert.equal(busy, { ok: false, ownerPid: Number(pid) });
      child.kill('SIGKILL');
      await exited(child);
      process.kill(sleeper, 0); // the sleeper is still alive
      const free = tryLock(path);
      assert.ok(free.ok, 'free as soon as the holder is gone');
      if (free.ok) await free.lock.release();
    } finally {
      child.kill('SIGKILL');
      await exited(child);
      if (sleeper) process.kill(sleeper, 'SIGKILL');
    }
  }),
);

test('a dead owner whose lock a forked child still holds (killed between fork and exec): takeOwnerLock waits for it', () =>
  withDir(async (dir) => {
    const path = join(dir, 'c.lock');
    // The holder takes the lock and records its pid as the addon does, forks a child that keeps
    // the inherited lock 600 ms without exec'ing (as a passt start caught between fork and exec),
    // and dies at once.
    const script = [
      'import fcntl, os, sys, time',
      `fd = os.open(${JSON.stringify(path)}, os.O_RDWR | os.O_CREAT, 0o644)`,
      'fcntl.flock(fd, fcntl.LOCK_EX)',
      'os.ftruncate(fd, 0); os.write(fd, f"{os.getpid()}\\n".encode())',
      'if os.fork() == 0:',
      '    time.sleep(0.6); os._exit(0)',
      'print("forked", flush=True); os._exit(0)',
    ].join('\n');
    // No pipes: the forked child would hold them open and spawnSync would wait for it too.
    const r = spawnSync('python3', ['-c', script], { stdio: 'ignore' });
    assert.is(r.status, 0);
    const busy = tryLock(path);
    assert.not.ok(busy.ok, 'held by the forked child');
    const t0 = performance.now();
    const taken = await takeOwnerLock(path);
    const waited = performance.now() - t0;
    assert.ok(taken.ok, 'taken once the child let go');
    assert.ok(waited > 100 && waited < 3000, `waited ${waited.toFixed(0)} ms`);
    if (taken.ok) await taken.lock.release();
  }),
);

test('a held lock does not keep the process alive; its exit releases it', () =>
  withDir(async (dir) => {
    const path = join(dir, 'c.lock');
    const child = holder('take-and-return', path);
    await line(child, 'locked ');
    assert.is(await exited(child), 0, 'the holder exited on its own, lock still held');
    const free = tryLock(path);
    assert.ok(free.ok);
    if (free.ok) await free.lock.release();
  }),
);

test('inside one process two locks on one path exclude each other too', () =>
  withDir(async (dir) => {
    const path = join(dir, 'd.lock');
    const first = tryLock(path);
    assert.ok(first.ok);
    assert.equal(tryLock(path), { ok: false, ownerPid: process.pid });
    if (first.ok) await first.lock.release();
    const again = tryLock(path);
    assert.ok(again.ok);
    if (again.ok) await again.lock.release();
  }),
);

test('an unusable path is a TorporError with errno', () =>
  withDir(async (dir) => {
    const err = (() => {
      try {
        tryLock(join(dir, 'no-such-dir', 'e.lock'));
      } catch (e) {
        return e;
      }
    })();
    assert.instance(err, TorporError);
    assert.is((err as TorporError).code, 'IO_ERROR');
    assert.is((err as TorporError).errno, 2);
  }),
);

test('tryLock cost (printed, not asserted)', () =>
  withDir(async (dir) => {
    const path = join(dir, 'f.lock');
    const rounds = 2000;
    const started = process.hrtime.bigint();
    for (let i = 0; i < rounds; i++) {
      const r = tryLock(path);
      if (!r.ok) throw new Error('unexpectedly busy');
      await r.lock.release();
    }
    const takeUs = Number(process.hrtime.bigint() - started) / 1000 / rounds;
    const held = tryLock(path);
    const refusedStart = process.hrtime.bigint();
    for (let i = 0; i < rounds; i++) tryLock(path);
    const refusedUs = Number(process.hrtime.bigint() - refusedStart) / 1000 / rounds;
    if (held.ok) await held.lock.release();
    console.log(`  tryLock: ${takeUs.toFixed(1)} us to take and release, ${refusedUs.toFixed(1)} us when refused`);
  }),
);

test.run();
