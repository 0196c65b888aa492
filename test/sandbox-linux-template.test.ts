// Warm templates with the real Linux guest (lib/sandbox/template.ts): the first create boots and
// captures the template, later creates restore it; each sandbox's first pause writes only what
// changed since the template (docs/architecture.md#performance-targets: <= 8 MiB beyond the template after `echo hi > f`).
// Runs where a Linux guest can boot (a hardware-virtualization host, or the nested host of
// `npm run test:linux`); elsewhere registered as skipped, category linux-guest, with the reason.
//
// TORPOR_HOME is a fresh directory whose artifacts/ links to the real store.
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import type { Machine } from '../lib/vm/machine.js';
import { privateHome } from './sandbox-home.js';
import { testUnless } from './skip-unless.js';

const support = await linuxGuestSupport();
const linuxTest = testUnless('sandbox-linux-template', support.ok ? null : `this host cannot boot a Linux guest: ${support.reason}`, 'linux-guest');

const OPTS = { boot: { timeoutMs: 180_000 }, memoryMiB: 256, vcpus: 1 };
/** Emulated CPUs in the nested host: the restored guest may take seconds to answer. */
const CONNECT = { restoreTimeoutMs: 120_000, bootTimeoutMs: 180_000 };
const MiB = 1 << 20;

const home = privateHome(test, 'torpor-linux-template-');
const machineOf = (sbx: Sandbox) => (sbx as unknown as { machine: Machine }).machine;

function templateBuilds(): string[] {
  const base = join(home, 'templates', 'base');
  if (!existsSync(base)) return [];
  return readdirSync(base).flatMap((key) => readdirSync(join(base, key)).filter((n) => n.startsWith('b-')).map((b) => join(base, key, b)));
}

linuxTest('create from the template: python3 runs, two sandboxes diverge, echo hi > f then pause stays within 8 MiB beyond the template; connect continues it', async () => {
  const t0 = performance.now();
  const a = await Sandbox.create(OPTS);
  const firstMs = performance.now() - t0;
  let b: Sandbox | undefined;
  try {
    const ia = await a.getInfo();
    assert.is(ia.createdFrom, 'template', `created from ${ia.createdFrom}: ${ia.bootReason}`);
    assert.is(templateBuilds().length, 1);
    assert.is((await a.commands.run(['python3', '-c', 'print(6*7)'])).stdout, '42\n');

    await a.files.write('/tmp/only-in-a', 'a');
    assert.is((await a.commands.run('cat /tmp/only-in-a')).stdout, 'a');

    // docs/architecture.md#performance-targets's scenario: a sandbox from the template, `echo hi > f` as its first command, pause.
    const t1 = performance.now();
    b = await Sandbox.create(OPTS);
    const secondMs = performance.now() - t1;
    const dirtyAtCreate = machineOf(b).dirtyPageCount();
    await b.commands.run('echo hi > f');
    const firstOutputMs = performance.now() - t1;
    const dirtyAtPause = machineOf(b).dirtyPageCount();
    assert.is((await b.getInfo()).createdFrom, 'template');
    assert.is(templateBuilds().length, 1, 'the second create used the same build');
    const id = b.sandboxId;
    const r = await b.pause();
    const info = await Sandbox.getInfo(id);
    console.log(
      `  sandbox-linux-template: first create (builds the template) ${firstMs.toFixed(0)} ms; second (restores it) ${secondMs.toFixed(0)} ms, ` +
        `create -> echo hi > f done ${firstOutputMs.toFixed(0)} ms (emulated host); pause: ${(r.bytes / MiB).toFixed(2)} MiB written, ` +
        `${(info.bytesOnDisk / MiB).toFixed(2)} MiB on disk beyond the template; pages dirtied since the template: ${dirtyAtCreate} at create, ${dirtyAtPause} after the echo`,
    );
    assert.ok(r.bytes <= 8 * MiB, `the first pause wrote ${r.bytes} bytes`);
    assert.ok(info.bytesOnDisk <= 8 * MiB, `the paused sandbox takes ${info.bytesOnDisk} bytes beyond its template`);

    const again = await Sandbox.connect(id, CONNECT);
    b = again;
    const ib = await again.getInfo();
    assert.is(ib.resumedFrom, 'memory', `resumed from ${ib.resumedFrom}: ${ib.resumeReason}`);
    assert.is((await again.commands.run('cat f')).stdout, 'hi\n');
    // Diverged: a's file is not in b; the kernels' RNGs differ (RESUMED's entropy).
    assert.is((await again.commands.run('test -e /tmp/only-in-a && echo yes || echo no')).stdout, 'no\n');
    const rand = async (s: Sandbox) => (await s.commands.run('head -c 16 /dev/urandom | od -An -tx1')).stdout;
    assert.is.not(await rand(a), await rand(again));
  } finally {
    await b?.kill().catch(() => undefined);
    await a.kill().catch(() => undefined);
  }
  assert.is(templateBuilds().length, 1, 'kill leaves the template');
});

test.run();
