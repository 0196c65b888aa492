// `torpor ls|info|pause|kill|prune` and the owner rules of the sandbox commands, run as a user
// runs them (node bin/torpor.js, a separate process) on sandboxes this process made, with the
// test guest standing in for Linux (guest/testvm answers HELLO, PING, SYNC and RESUMED but runs
// no programs: exec, shell and logs run in test/cli-linux.test.ts). TORPOR_HOME is a fresh
// directory whose artifacts/ links to the real store.
import { existsSync, mkdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Sandbox } from '../lib/sandbox/sandbox.js';
import { takeOwnerLock } from '../lib/store/owner-lock.js';
import { newSandboxId } from '../lib/store/sandbox-dir.js';
import { NESTED } from './bounds.js';
import { runTorpor } from './fixtures/cli.js';
import { privateHome, testvmSandboxTest } from './sandbox-home.js';
import { testvmImage } from './vmm-guests.js';

const kvmTest = await testvmSandboxTest('cli-sandbox');
const kernel = testvmImage()!;
/** A CLI run is a Node start with tsx: seconds in the emulated nested host. */
const CLI_MS = NESTED ? 180_000 : 60_000;

const bootOpts = () => ({
  template: false as const,
  vcpus: 1,
  memoryMiB: 64,
  boot: { kernel, timeoutMs: 15_000, cmdlineExtra: 'testvm.agent_ready=1 testvm.count=1' },
});

const torpor = (...args: string[]) => runTorpor(CLI_MS, ...args);

privateHome(test, 'torpor-cli-');

kvmTest('ls, info and pause of a paused sandbox; a sandbox this process runs is SANDBOX_BUSY, naming this pid; kill', async () => {
  const paused = await Sandbox.create(bootOpts());
  const running = await Sandbox.create(bootOpts());
  try {
    await paused.pause();

    const ls = await torpor('ls', '--json');
    assert.is(ls.status, 0, ls.stderr);
    const listed = JSON.parse(ls.stdout) as Array<{ sandboxId: string; state: string; ownerPid: number | null }>;
    const byId = new Map(listed.map((s) => [s.sandboxId, s]));
    assert.is(byId.get(paused.sandboxId)?.state, 'paused');
    assert.is(byId.get(running.sandboxId)?.state, 'running');
    assert.is(byId.get(running.sandboxId)?.ownerPid, process.pid);

    const human = await torpor('ls', '--state', 'paused');
    assert.is(human.status, 0, human.stderr);
    assert.match(human.stdout, /^ID\s+STATE\s+TEMPLATE/);
    assert.ok(human.stdout.includes(paused.sandboxId), human.stdout);
    assert.not.ok(human.stdout.includes(running.sandboxId), 'filtered by --state');

    const info = await torpor('info', running.sandboxId);
    assert.is(info.status, 0, info.stderr);
    assert.match(info.stdout, new RegExp(`^state:\\s+running \\(owned by pid ${process.pid}\\)$`, 'm'));

    const again = await torpor('pause', paused.sandboxId);
    assert.is(again.status, 0, again.stderr);
    assert.match(again.stdout, /already paused \(generation 1\)/);

    for (const args of [['pause', running.sandboxId], ['kill', running.sandboxId]]) {
      const busy = await torpor(...args);
      assert.is(busy.status, 1, `${args[0]}: ${busy.stderr}`);
      assert.match(busy.stderr, /^torpor: SANDBOX_BUSY: /);
      assert.match(busy.stderr, new RegExp(`process ${process.pid}\\b`));
    }
    // exec passes a program's status through, so its own failure is 125, not 1.
    const exec = await torpor('exec', running.sandboxId, '--', 'true');
    assert.is(exec.status, 125, exec.stderr);
    assert.match(exec.stderr, /SANDBOX_BUSY/);
    assert.ok(running.isRunning(), 'refused commands left the running sandbox alone');

    const killed = await torpor('kill', paused.sandboxId);
    assert.is(killed.status, 0, killed.stderr);
    const gone = await torpor('info', paused.sandboxId);
    assert.is(gone.status, 1);
    assert.match(gone.stderr, /SANDBOX_NOT_FOUND/);
    const missing = await torpor('kill', paused.sandboxId);
    assert.is(missing.status, 1);
    assert.match(missing.stderr, /SANDBOX_NOT_FOUND/);
  } finally {
    await running.kill().catch(() => undefined);
    await Sandbox.kill(paused.sandboxId).catch(() => undefined);
  }
});

kvmTest('prune: --dry-run lists, then removes paused sandboxes older than --older-than; running ones untouched', async () => {
  const old = await Sandbox.create(bootOpts());
  const running = await Sandbox.create(bootOpts());
  try {
    await old.pause();
    const keep = await torpor('prune', '--older-than', '1h', '--json');
    assert.is(keep.status, 0, keep.stderr);
    assert.equal((JSON.parse(keep.stdout) as { sandboxes: unknown[] }).sandboxes, [], 'paused a moment ago: younger than 1h');

    const dry = await torpor('prune', '--older-than', '0', '--dry-run', '--json');
    assert.is(dry.status, 0, dry.stderr);
    const planned = JSON.parse(dry.stdout) as { dryRun: boolean; sandboxes: Array<{ sandboxId: string; bytesOnDisk: number }> };
    assert.ok(planned.dryRun);
    assert.equal(planned.sandboxes.map((s) => s.sandboxId), [old.sandboxId]);
    assert.ok(planned.sandboxes[0]!.bytesOnDisk > 0);
    assert.is((await Sandbox.getInfo(old.sandboxId)).state, 'paused', 'a dry run removes nothing');

    const done = await torpor('prune', '--older-than', '0');
    assert.is(done.status, 0, done.stderr);
    assert.match(done.stdout, /^removed 1 paused sandbox /);
    assert.equal((await Sandbox.list()).map((s) => s.sandboxId), [running.sandboxId]);
    assert.ok(running.isRunning());
  } finally {
    await running.kill().catch(() => undefined);
    await Sandbox.kill(old.sandboxId).catch(() => undefined);
  }
});

const DAY_MS = 86_400_000;
const DEAD_PID = '4194305\n'; // past any pid_max: no such process

/** `path` with its times set `ageMs` in the past. */
function aged(path: string, ageMs: number): string {
  const at = new Date(Date.now() - ageMs);
  utimesSync(path, at, at);
  return path;
}

/** A directory under sandboxes/ holding `files` (and snapshots/), last changed `ageMs` ago. */
function sandboxDirOf(files: Record<string, string>, ageMs: number): string {
  const dir = join(process.env.TORPOR_HOME!, 'sandboxes', newSandboxId());
  mkdirSync(join(dir, 'snapshots'), { recursive: true });
  for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
  return aged(dir, ageMs);
}

test('prune removes what an interrupted create left (no meta.json, no owner), older than --older-than and a minute; a dry run changes nothing', async () => {
  // One past its lock (a dead owner's pid in it, a meta.json temporary file), one before it.
  const interrupted = [sandboxDirOf({ overlay: 'disk top', 'owner.lock': DEAD_PID, 'meta.json.4194305.0a1b2c.tmp': '{"id"' }, 2 * DAY_MS), sandboxDirOf({}, 3 * DAY_MS)];
  const damaged = sandboxDirOf({ 'meta.json': '{"id": "cut short' }, 2 * DAY_MS);
  const young = sandboxDirOf({ overlay: 'disk top' }, 30_000); // older than --older-than 0, younger than the minute
  const held = sandboxDirOf({}, 0); // a create in progress: this process holds its lock
  const lock = await takeOwnerLock(join(held, 'owner.lock'));
  assert.ok(lock.ok);
  aged(held, 2 * DAY_MS);
  const interruptedIds = interrupted.map((d) => basename(d)).sort();
  try {
    const dry = await torpor('prune', '--older-than', '1d', '--dry-run', '--json');
    assert.is(dry.status, 0, dry.stderr);
    assert.equal((JSON.parse(dry.stdout) as { interrupted: string[] }).interrupted, interruptedIds);
    assert.ok(interrupted.every((d) => existsSync(d)), 'a dry run removes nothing');
    assert.is(readFileSync(join(interrupted[0]!, 'owner.lock'), 'utf8'), DEAD_PID, 'a dry run takes no lock');

    const done = await torpor('prune', '--older-than', '0');
    assert.is(done.status, 0, done.stderr);
    for (const id of interruptedIds) assert.match(done.stdout, new RegExp(`${id}  an interrupted create`));
    assert.ok(interrupted.every((d) => !existsSync(d)));
    assert.ok(existsSync(join(young, 'overlay')), 'changed 30 s ago: within the minute, whatever --older-than says');
    assert.ok(existsSync(held), 'a directory whose lock is held is being created');
    assert.ok(existsSync(join(damaged, 'meta.json')), 'a meta.json that cannot be read is a sandbox with data');
  } finally {
    if (lock.ok) await lock.lock.release();
    for (const dir of [...interrupted, damaged, young, held]) rmSync(dir, { recursive: true, force: true });
  }
});

test('prune removes a fork base nothing uses, in the same run as the interrupted create that named it, and keeps one of the last minute', async () => {
  const forks = join(process.env.TORPOR_HOME!, 'templates', '.forks');
  mkdirSync(forks, { recursive: true });
  const baseOf = (ageMs: number) => {
    const base = join(forks, `f-${Date.now() - ageMs}-${newSandboxId().slice(-8)}`);
    mkdirSync(base);
    writeFileSync(join(base, 'current'), '1\n');
    return aged(base, ageMs);
  };
  const oldBase = baseOf(2 * DAY_MS);
  const newBase = baseOf(0); // a fork in progress has not named it in its children yet
  const child = sandboxDirOf({ 'owner.lock': DEAD_PID }, 2 * DAY_MS); // a fork's child cut off before its meta.json
  try {
    const dry = await torpor('prune', '--older-than', '1d', '--dry-run', '--json');
    assert.is(dry.status, 0, dry.stderr);
    const planned = JSON.parse(dry.stdout) as { interrupted: string[]; forkBases: string[] };
    assert.equal(planned.interrupted, [basename(child)]);
    assert.equal(planned.forkBases, [oldBase], 'the directory it would remove does not keep the base');

    const done = await torpor('prune', '--older-than', '1d', '--json');
    assert.is(done.status, 0, done.stderr);
    assert.equal((JSON.parse(done.stdout) as { forkBases: string[] }).forkBases, [oldBase], 'one run, not two');
    assert.not.ok(existsSync(oldBase));
    assert.not.ok(existsSync(child));
    assert.ok(existsSync(newBase), 'a fork base of the last minute stays');
  } finally {
    for (const dir of [oldBase, newBase, child]) rmSync(dir, { recursive: true, force: true });
  }
});

test('usage errors exit 2 and say what is wrong', async () => {
  for (const [args, says] of [
    [['exec', 'sbx_x'], /takes ID -- PROGRAM/],
    [['ls', '--state', 'asleep'], /--state takes one of starting, running/],
    [['prune', '--older-than', 'soon'], /a duration such as 90s/],
    [['logs', 'sbx_x', 'one'], /PID must be a process id/],
  ] as const) {
    const r = await torpor(...args);
    assert.is(r.status, 2, `${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, says);
  }
});

test.run();
