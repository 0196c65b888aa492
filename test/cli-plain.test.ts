// The sandbox commands' cases that need no machine, run as a user runs them (node
// bin/torpor.js, a separate process): usage errors, and `torpor prune` of what a crash leaves
// (interrupted creates, fork bases). Plain tests on every host, apart from test/cli-sandbox.test.ts,
// whose sandboxes need KVM (in the nested host a CLI run takes tens of seconds: these would only
// lengthen that file there). TORPOR_HOME is a fresh directory.
import { existsSync, mkdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { takeOwnerLock } from '../lib/store/owner-lock.js';
import { newSandboxId } from '../lib/store/sandbox-dir.js';
import { runTorpor } from './fixtures/cli.js';
import { privateHome } from './sandbox-home.js';

const torpor = (...args: string[]) => runTorpor(60_000, ...args);

privateHome(test, 'torpor-cli-plain-');

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
