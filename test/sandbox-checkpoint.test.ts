// Checkpoints and fork (issue 23): sbx.checkpoint() writes a generation while the sandbox runs on;
// sbx.restore() and Sandbox.connect(id, { checkpoint }) go back to it, memory and disk, and the
// checkpoints after it go; a pause keeps every checkpoint's files. sbx.fork(n) makes n sandboxes
// that continue it. The test guest stands in for Linux: its counter (in RAM) says which memory
// runs, its disk blocks which disk, its status page the RESUMED it got (with the entropy).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { join } from 'node:path';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { Sandbox } from '../lib/sandbox/sandbox.js';
import type { Machine } from '../lib/vm/machine.js';
import { privateHome, testvmSandboxTest, testvmStatus } from './sandbox-home.js';
import { sleep, testvmCommand, testvmImage } from './vmm-guests.js';
import { NESTED } from './bounds.js';
import { nodeArgs } from './child-node.js';

const kvmTest = await testvmSandboxTest('sandbox-checkpoint');
const kernel = testvmImage()!;
const bootOpts = {
  template: false as const,
  vcpus: 1,
  memoryMiB: 64,
  boot: { kernel, timeoutMs: 15_000, cmdlineExtra: 'testvm.agent_ready=1 testvm.count=1' },
};
const home = privateHome(test, 'torpor-checkpoint-');
/** How long a child Node process may take to get going (emulated in the nested host). */
const CHILD_MS = NESTED ? 180_000 : 60_000;

const machineOf = (sbx: Sandbox) => (sbx as unknown as { machine: Machine }).machine;
const counter = (sbx: Sandbox) => testvmStatus(sbx).counter;
const SECTOR = 4096;
const write = async (sbx: Sandbox, pattern: number) =>
  assert.match(await testvmCommand(machineOf(sbx), `blk-write ${SECTOR} 0x${pattern.toString(16)} 8`, 'blk-write'), /^blk-write=ok/);
const holds = async (sbx: Sandbox, pattern: number) =>
  /^blk-verify=ok/.test(await testvmCommand(machineOf(sbx), `blk-verify ${SECTOR} 0x${pattern.toString(16)} 8`, 'blk-verify'));

async function until(cond: () => boolean, what: string, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

kvmTest('checkpoint while running, restore goes back (memory and disk), later checkpoints go, a pause keeps their files', async () => {
  const sbx = await Sandbox.create(bootOpts);
  const id = sbx.sandboxId;
  const gen = (n: number) => join(home, 'sandboxes', id, 'snapshots', `gen-${n}`);
  try {
    await until(() => counter(sbx) > 1000, 'the guest counting');
    await write(sbx, 0xa11);
    const first = await sbx.checkpoint('first');
    const atFirst = counter(sbx);
    assert.is(first.id, 1);
    assert.is(first.label, 'first');
    assert.ok(first.bytes > 0);
    assert.is(sbx.state, 'running', 'the sandbox runs on');
    await until(() => counter(sbx) > atFirst + 1000, 'the counter going on after the checkpoint');

    await write(sbx, 0xb22);
    const second = await sbx.checkpoint();
    await write(sbx, 0xc33);
    const listed = await sbx.checkpoints();
    assert.equal(listed.map((c) => [c.id, c.label]), [[1, 'first'], [2, undefined]]);
    assert.ok(listed.every((c) => c.bytes > 0 && c.createdAt instanceof Date));
    assert.equal((await Sandbox.getInfo(id)).checkpoints?.map((c) => [c.id, c.label]), [[1, 'first'], [2, undefined]], 'getInfo names them too');
    await sleep(300); // the counter runs well past the first checkpoint
    const beforeRestore = counter(sbx);

    // Back to 'first': its memory (the counter from where it was) and its disk (0xa11).
    assert.is(await sbx.restore('first'), sbx);
    assert.is(sbx.state, 'running');
    const afterRestore = counter(sbx);
    assert.ok(afterRestore < beforeRestore, `the counter went back: ${afterRestore} < ${beforeRestore}`);
    assert.ok(await holds(sbx, 0xa11), "the first checkpoint's disk");
    assert.equal((await sbx.checkpoints()).map((c) => c.id), [1], 'the checkpoint after it went');
    assert.not.ok(existsSync(gen(2)), "the later generation's files went");
    assert.is((await sbx.getInfo()).resumedFrom, 'memory');

    // A pause writes the next generation and keeps the checkpoint's files; connect to it again.
    await write(sbx, 0xd44);
    assert.is((await sbx.pause()).generation, 2);
    assert.ok(existsSync(gen(1)), "a pause keeps a checkpoint's generation");
    assert.equal((await sbx.checkpoints()).map((c) => c.id), [1]);
    const again = await Sandbox.connect(id, { checkpoint: first });
    assert.ok(await holds(again, 0xa11), 'connect { checkpoint }: its disk');
    assert.is.not(second.id, 1);

    // Unknown checkpoints are INVALID_ARGUMENT naming the ones there are; removal forgets one.
    const unknown = await again.restore(7).catch((e: unknown) => e);
    assert.ok(unknown instanceof TorporError && unknown.code === 'INVALID_ARGUMENT', String(unknown));
    assert.match((unknown as Error).message, /it has: 1 \(first\)/);
    await again.removeCheckpoint('first');
    assert.equal(await again.checkpoints(), []);
    await again.pause();
    assert.equal(await again.checkpoints(), []);
    await again.resume();
  } finally {
    await Sandbox.kill(id).catch(() => undefined);
  }
});

/** Runs test/fixtures/sandbox-child.ts checkpoint-write-and-hold until it wrote its block, then SIGKILLs it. */
async function ownerDiesAfterCheckpoint(id: string, sector: number): Promise<number> {
  const holder = spawn(process.execPath, nodeArgs('test/fixtures/sandbox-child.ts', 'checkpoint-write-and-hold', id, String(sector)), {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  holder.stdout.on('data', (d: Buffer) => (out += d.toString()));
  let err = '';
  holder.stderr.on('data', (d: Buffer) => (err += d.toString()));
  try {
    const end = Date.now() + CHILD_MS;
    while (!out.includes('written')) {
      if (Date.now() > end || holder.exitCode !== null) throw new Error(`the child did not write its block: ${out} ${err}`);
      await sleep(20);
    }
  } finally {
    const exited = new Promise((r) => holder.once('exit', r));
    holder.kill('SIGKILL');
    await exited;
  }
  return holder.pid!;
}

kvmTest("an owner SIGKILLed after a checkpoint and a write: connect boots the disk it last wrote (the write kept); onOwnerDeath 'memory' restores the checkpoint", async () => {
  for (const onOwnerDeath of ['disk', 'memory'] as const) {
    const sbx = await Sandbox.create(bootOpts);
    const id = sbx.sandboxId;
    try {
      await sbx.pause();
      const pid = await ownerDiesAfterCheckpoint(id, 640000);
      const back = await Sandbox.connect(id, { onOwnerDeath });
      const info = await back.getInfo();
      const [checkpoint] = await back.checkpoints();
      assert.is(checkpoint?.label, 'before-the-write');
      assert.ok(info.lostInterval, 'the interval after the checkpoint is reported');
      assert.is(info.lostInterval!.from.getTime(), checkpoint!.createdAt.getTime(), 'lost from the checkpoint on');
      const verify = await testvmCommand(machineOf(back), 'blk-verify 640000 0x7e57 8', 'blk-verify', 60_000);
      if (onOwnerDeath === 'disk') {
        assert.is(info.resumedFrom, 'disk', info.resumeReason);
        assert.match(info.resumeReason ?? '', new RegExp(`owner \\(pid ${pid}\\) died`));
        assert.is(info.lost, 'processes');
        assert.match(verify, /^blk-verify=ok/, 'the block written after the checkpoint');
      } else {
        assert.is(info.resumedFrom, 'memory');
        assert.is(info.lost, 'processes-and-files');
        assert.not.match(verify, /^blk-verify=ok/, 'the checkpoint, before the block');
      }
    } finally {
      await Sandbox.kill(id).catch(() => undefined);
    }
  }
});

kvmTest('fork(3): the children continue the parent (memory, disk), each its own sandbox with fresh entropy; the parent runs on; the fork base goes with the last child', async () => {
  const parent = await Sandbox.create(bootOpts);
  const kids: Sandbox[] = [];
  try {
    await until(() => counter(parent) > 1000, 'the guest counting');
    await write(parent, 0x111);
    const atFork = counter(parent);
    kids.push(...(await parent.fork(3)));
    assert.is(kids.length, 3);
    const ids = new Set([parent.sandboxId, ...kids.map((k) => k.sandboxId)]);
    assert.is(ids.size, 4, 'each child has its own id');
    assert.is(parent.state, 'running', 'the parent runs on');
    await until(() => counter(parent) > atFork + 1000, 'the parent counting on');
    const heads = new Set<bigint>();
    for (const kid of kids) {
      assert.is(kid.state, 'running');
      const info = await kid.getInfo();
      assert.is(info.createdFrom, 'fork');
      assert.is(info.forkedFrom, parent.sandboxId);
      const st = testvmStatus(kid);
      assert.ok(st.counter >= atFork, `the child's counter (${st.counter}) continues the parent's (${atFork})`);
      assert.is(st.resumed, 1, 'RESUMED before anything else');
      assert.is(st.entropyLen, 64);
      heads.add(st.entropyHead);
      assert.ok(await holds(kid, 0x111), "the parent's disk as at the fork");
    }
    assert.is(heads.size, 3, 'each child got its own entropy');

    // They diverge: a child's write is its own.
    await write(kids[0]!, 0x222);
    assert.ok(await holds(kids[1]!, 0x111));
    assert.ok(await holds(parent, 0x111));
    assert.ok(await holds(kids[0]!, 0x222));

    // Independent: the parent killed, a child pauses and connects; the base goes with the last child.
    const base = (await readdir(join(home, 'templates', '.forks'))).map((n) => join(home, 'templates', '.forks', n));
    assert.is(base.length, 1);
    await parent.kill();
    await kids[0]!.pause();
    const back = await Sandbox.connect(kids[0]!.sandboxId);
    assert.ok(await holds(back, 0x222), "the child's own write, after a pause");
    kids[0] = back;
    await Promise.all(kids.slice(0, 2).map((k) => k.kill()));
    assert.ok(existsSync(base[0]!), 'kept while a child uses it');
    await kids[2]!.kill();
    assert.not.ok(existsSync(base[0]!), 'removed with the last child');

    const bad = await Sandbox.create(bootOpts).then(async (s) => {
      try {
        return await s.fork(0).catch((e: unknown) => e);
      } finally {
        await s.kill();
      }
    });
    assert.ok(bad instanceof TorporError && bad.code === 'INVALID_ARGUMENT', String(bad));
  } finally {
    await Promise.allSettled([parent, ...kids].map((s) => Sandbox.kill(s.sandboxId)));
  }
});

test.run();
