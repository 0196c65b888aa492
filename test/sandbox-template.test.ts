// Warm templates (lib/sandbox/template.ts) for real, with the test guest standing in for Linux
// (as in sandbox-pause.test.ts): guest/testvm with testvm.agent_ready=1 answers HELLO, PING,
// SYNC and RESUMED on vsock 1024 and, with testvm.count=1, advances a counter in its status
// page. A sandbox restored from the template shows the template's SYNC and one RESUMED in that
// page (a boot shows neither) and its counter going on from the template's value.
//
// TORPOR_HOME is a fresh directory whose artifacts/ links to the real store.
import { spawn } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Sandbox } from '../lib/sandbox/sandbox.js';
import type { Machine } from '../lib/vm/machine.js';
import { privateHome, testvmSandboxTest, testvmStatus } from './sandbox-home.js';
import { sleep, testvmCommand, testvmImage } from './vmm-guests.js';
import { NESTED } from './bounds.js';
import { nodeArgs } from './child-node.js';

const kvmTest = await testvmSandboxTest('sandbox-template');
const kernel = testvmImage()!;

/** How long a child Node process may take to get going (emulated in the nested host). */
const CHILD_MS = NESTED ? 180_000 : 60_000;
const internals = (sbx: Sandbox) => sbx as unknown as { machine: Machine; dir: string };
const guestStatus = testvmStatus;

const bootOpts = (memoryMiB = 64) => ({
  vcpus: 1,
  memoryMiB,
  boot: { kernel, timeoutMs: 15_000, cmdlineExtra: 'testvm.agent_ready=1 testvm.count=1' },
});

const home = privateHome(test, 'torpor-sbx-template-');
const templatesOf = () => join(home, 'templates', 'base');

/** The template builds (templates/base/<key>/b-*) under the test's home, by key. */
function builds(): Array<{ key: string; build: string; current: boolean }> {
  const out: Array<{ key: string; build: string; current: boolean }> = [];
  if (!existsSync(templatesOf())) return out;
  for (const key of readdirSync(templatesOf())) {
    const root = join(templatesOf(), key);
    const current = existsSync(join(root, 'current')) ? readFileSync(join(root, 'current'), 'utf8').trim() : '';
    for (const b of readdirSync(root).filter((n) => n.startsWith('b-'))) out.push({ key, build: join(root, b), current: b === current });
  }
  return out;
}

/** Every file under `dir` with its size and mtime: what "never rewritten" compares. */
function fileStamps(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else {
        const st = statSync(p);
        out[p] = `${st.size}:${st.mtimeMs}:${st.ino}`;
      }
    }
  };
  walk(dir);
  return out;
}

async function until(cond: () => boolean | Promise<boolean>, what: string, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

kvmTest('the first create builds the template, later ones restore it; sandboxes from one template diverge', async () => {
  let stamps: Record<string, string> = {};
  const t0 = performance.now();
  const a = await Sandbox.create(bootOpts());
  const firstMs = performance.now() - t0;
  try {
    const info = await a.getInfo();
    assert.is(info.createdFrom, 'template', JSON.stringify(info));
    assert.is(info.template, 'base');
    const made = builds();
    assert.is(made.length, 1, JSON.stringify(made));
    assert.ok(made[0]!.current);
    stamps = fileStamps(made[0]!.build);
    // Restored: the template's SYNC (taken before its capture) and one RESUMED are in the page.
    const sa = guestStatus(a);
    assert.is(sa.syncs, 1, 'the template was synced before its capture');
    assert.is(sa.resumed, 1, 'one RESUMED after the restore');
    assert.is(sa.entropyLen, 64);
    assert.ok(sa.counter > 0, `counter ${sa.counter} goes on from the template's`);
    const meta = JSON.parse(await readFile(join(internals(a).dir, 'meta.json'), 'utf8'));
    assert.is(meta.templateBuild, made[0]!.build);
    assert.equal(meta.diskLayers, [join(made[0]!.build, 'gen-1/disk0.overlay')]);

    const t1 = performance.now();
    const b = await Sandbox.create(bootOpts());
    const secondMs = performance.now() - t1;
    try {
      assert.is((await b.getInfo()).createdFrom, 'template');
      assert.equal(builds(), made, 'the second create used the same build');
      const sb = guestStatus(b);
      assert.is(sb.syncs, 1);
      assert.is(sb.resumed, 1);
      // Fresh entropy per sandbox: two restores of one image do not share RNG state.
      assert.is.not(sb.entropyHead, sa.entropyHead);

      // Memory: a word written in a is not in b.
      const ADDR = 0x3000000;
      const before = internals(b).machine.readGuest(ADDR, 4).readUInt32LE();
      assert.match(await testvmCommand(internals(a).machine, `poke 0x${ADDR.toString(16)} 0x5a5a1234`, 'poke'), /^poke=ok/);
      assert.is(internals(a).machine.readGuest(ADDR, 4).readUInt32LE(), 0x5a5a1234);
      assert.is(internals(b).machine.readGuest(ADDR, 4).readUInt32LE(), before);
      // Disk: sectors a writes (its own top layer) read back in a, not in b.
      assert.match(await testvmCommand(internals(a).machine, 'blk-write 4096 7 8', 'blk-write'), /^blk-write=ok/);
      assert.match(await testvmCommand(internals(a).machine, 'blk-verify 4096 7 8', 'blk-verify'), /^blk-verify=ok/);
      assert.match(await testvmCommand(internals(b).machine, 'blk-verify 4096 7 8', 'blk-verify'), /^blk-verify=bad/);
      // Both counters run on their own.
      const ca = guestStatus(a).counter;
      const cb = guestStatus(b).counter;
      await until(() => guestStatus(a).counter > ca && guestStatus(b).counter > cb, 'both counters advancing');
      console.log(`  sandbox-template: first create (builds the template) ${firstMs.toFixed(0)} ms, second (restores it) ${secondMs.toFixed(0)} ms`);
    } finally {
      await b.kill();
    }
  } finally {
    await a.kill();
  }
  // kill removed the sandboxes, never the template.
  assert.equal(readdirSync(join(home, 'sandboxes')).filter((n) => n.startsWith('sbx_')), []);
  assert.is(builds().length, 1);
  assert.equal(fileStamps(builds()[0]!.build), stamps, 'the template was not written');
});

kvmTest('a template sandbox: its first pause writes a diff over the template; connect continues it; kill leaves the template', async () => {
  const sbx = await Sandbox.create(bootOpts());
  const id = sbx.sandboxId;
  const dir = internals(sbx).dir;
  const build = builds().find((b) => b.current)!;
  const stamps = fileStamps(build.build);
  const templateMem = statSync(join(build.build, 'gen-1', 'mem.layer')).size;
  try {
    const c0 = guestStatus(sbx).counter;
    await until(() => guestStatus(sbx).counter > c0 + 1000, 'the guest counting');
    const r = await sbx.pause();
    assert.is(r.generation, 1);
    const manifest = JSON.parse(await readFile(join(dir, 'snapshots', 'gen-1', 'manifest.json'), 'utf8'));
    assert.is(manifest.memory.kind, 'diff', JSON.stringify(manifest));
    assert.equal(manifest.layers, [join(build.build, 'gen-1', 'mem.layer'), 'gen-1/mem.layer']);
    const layerBytes = statSync(join(dir, 'snapshots', 'gen-1', 'mem.layer')).size;
    assert.ok(r.bytes < templateMem / 4, `pause wrote ${r.bytes} bytes; the template's full layer is ${templateMem}`);
    assert.ok(layerBytes <= r.bytes);
    const info = await Sandbox.getInfo(id);
    assert.ok(info.bytesOnDisk < templateMem / 4, `the paused sandbox takes ${info.bytesOnDisk} bytes beyond its template (${templateMem})`);
    const meta = JSON.parse(await readFile(join(dir, 'meta.json'), 'utf8'));
    assert.equal(meta.diskLayers, [join(build.build, 'gen-1/disk0.overlay'), 'snapshots/gen-1/disk0.overlay']);
    console.log(`  sandbox-template: first pause of a template sandbox ${r.bytes} bytes (diff layer ${layerBytes}; template's full layer ${templateMem}), ${info.bytesOnDisk} bytes on disk`);

    // connect: from memory, the counter goes on, a second RESUMED.
    const again = await Sandbox.connect(id);
    try {
      const st = guestStatus(again);
      assert.is((await again.getInfo()).resumedFrom, 'memory');
      assert.ok(st.counter > c0 + 1000, `counter ${st.counter}`);
      assert.is(st.resumed, 2);
      const r2 = await again.pause();
      assert.is(r2.generation, 2);
      assert.ok(r2.bytes < templateMem / 4);
      // A boot from that generation's disk: the template's layer under the sandbox's.
      const booted = await Sandbox.connect(id, { onResume: 'reboot' });
      assert.is((await booted.getInfo()).resumedFrom, 'disk');
      assert.is(guestStatus(booted).syncs, 0, 'booted, not restored');
      await booted.kill();
    } finally {
      await again.kill();
    }
    assert.not.ok(existsSync(dir));
  } finally {
    await sbx.kill().catch(() => undefined);
    await Sandbox.kill(id).catch(() => undefined);
  }
  assert.equal(fileStamps(build.build), stamps, 'the template was not written');
});

kvmTest('a template sandbox paused 11 times: its own layers merge over the template\'s (never a copy of it), older generations swept', async () => {
  const sbx = await Sandbox.create(bootOpts());
  const id = sbx.sandboxId;
  const dir = internals(sbx).dir;
  const build = builds().find((b) => b.current)!;
  const templateMem = statSync(join(build.build, 'gen-1', 'mem.layer')).size;
  let s = sbx;
  try {
    for (let g = 1; g <= 11; g++) {
      assert.match(await testvmCommand(internals(s).machine, `blk-write ${g * 64} 0x${(0x8000 + g).toString(16)} 8`, 'blk-write'), /^blk-write=ok/);
      await s.pause();
      s = await Sandbox.connect(id);
      await sleep(NESTED ? 3000 : 300); // the merge a restore starts: small diffs (emulated in the nested host)
    }
    await s.pause();
    const manifest = JSON.parse(await readFile(join(dir, 'snapshots', 'gen-12', 'manifest.json'), 'utf8'));
    // The template's full layer stays the bottom; the sandbox's own diffs were merged into one.
    assert.is(manifest.layers[0], join(build.build, 'gen-1', 'mem.layer'), manifest.layers.join(' '));
    assert.ok(manifest.layers.length < 12, `memory chain of ${manifest.layers.length}: ${manifest.layers.join(' ')}`);
    assert.ok(manifest.layers.some((p: string) => p.startsWith('layers/merged-')), manifest.layers.join(' '));
    assert.is(manifest.disks[0][0], join(build.build, 'gen-1/disk0.overlay'));
    assert.ok(manifest.disks[0].length < 12, manifest.disks[0].join(' '));
    const info = await Sandbox.getInfo(id);
    assert.ok(info.bytesOnDisk < templateMem / 4, `the sandbox takes ${info.bytesOnDisk} bytes beyond its template (${templateMem})`);
    console.log(`  sandbox-template: after 12 pauses ${info.bytesOnDisk} bytes on disk beyond the template (its full layer ${templateMem}); memory chain ${manifest.layers.length}, disk ${manifest.disks[0].length} layers`);
    s = await Sandbox.connect(id);
    assert.is((await s.getInfo()).resumedFrom, 'memory');
    for (let g = 1; g <= 11; g++)
      assert.match(await testvmCommand(internals(s).machine, `blk-verify ${g * 64} 0x${(0x8000 + g).toString(16)} 8`, 'blk-verify'), /^blk-verify=ok/, `write ${g}`);
    await s.kill();
  } finally {
    await Sandbox.kill(id).catch(() => undefined);
  }
});

kvmTest('a template sandbox never paused whose owner died: connect boots its disk (template layer + what it wrote)', async () => {
  const p = spawn(process.execPath, nodeArgs('test/fixtures/template-child.ts', '64', 'write-and-hold'), { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  p.stdout.on('data', (d: Buffer) => (out += d.toString()));
  p.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const exited = new Promise((r) => p.once('exit', r));
  await until(() => out.includes('"id"') || p.exitCode !== null, 'the child writing', CHILD_MS);
  assert.ok(out.includes('"id"'), `the child wrote (${err})`);
  p.kill('SIGKILL');
  await exited;
  const id = (JSON.parse(out.trim().split('\n').pop()!) as { id: string }).id;
  const back = await Sandbox.connect(id);
  try {
    const info = await back.getInfo();
    assert.is(info.resumedFrom, 'disk');
    assert.is(info.generation, 0);
    assert.match(await testvmCommand(internals(back).machine, 'blk-verify 4096 0x77 8', 'blk-verify'), /^blk-verify=ok/);
    const meta = JSON.parse(await readFile(join(internals(back).dir, 'meta.json'), 'utf8'));
    assert.equal(meta.diskLayers, [meta.diskLayers[0], 'overlay']);
    assert.match(meta.diskLayers[0], /\/templates\/base\/[0-9a-f]+\/b-\d+-[0-9a-f]+\/gen-1\/disk0\.overlay$/);
    // Paused and continued again: the template's layer, the adopted top, then the generation's.
    await back.pause();
    const again = await Sandbox.connect(id);
    assert.match(await testvmCommand(internals(again).machine, 'blk-verify 4096 0x77 8', 'blk-verify'), /^blk-verify=ok/);
    await again.kill();
  } finally {
    await back.kill().catch(() => undefined);
    await Sandbox.kill(id).catch(() => undefined);
  }
});

kvmTest('a corrupted template is replaced by a new build: create still restores; the old build stays for its sandboxes', async () => {
  const old = builds().find((b) => b.current)!;
  const keep = await Sandbox.create(bootOpts());
  await keep.pause();
  const state = join(old.build, 'gen-1', 'vm.state');
  const bytes = await readFile(state);
  bytes[bytes.length >> 1]! ^= 0xff;
  await writeFile(state, bytes);
  try {
    const sbx = await Sandbox.create(bootOpts());
    try {
      const info = await sbx.getInfo();
      assert.is(info.createdFrom, 'template', JSON.stringify(info));
      const now = builds();
      assert.is(now.length, 2);
      const current = now.find((b) => b.current)!;
      assert.is.not(current.build, old.build);
      assert.ok(existsSync(old.build), 'the old build is kept');
      assert.is(guestStatus(sbx).syncs, 1);
      // The next create uses the new build.
      const next = await Sandbox.create(bootOpts());
      assert.is(JSON.parse(await readFile(join(internals(next).dir, 'meta.json'), 'utf8')).templateBuild, current.build);
      await next.kill();
    } finally {
      await sbx.kill();
    }
    // A sandbox paused from the old build continues from memory: its own vm.state, over the old
    // build's memory layer (still there, unchanged).
    const back = await Sandbox.connect(keep.sandboxId);
    assert.is((await back.getInfo()).resumedFrom, 'memory');
    await back.kill();
  } finally {
    await Sandbox.kill(keep.sandboxId).catch(() => undefined);
  }
});

kvmTest('two processes creating with new settings at once: one builds the template, both restore that build', async () => {
  const keys = new Set(builds().map((b) => b.key));
  const p = spawn(process.execPath, nodeArgs('test/fixtures/template-child.ts', '72'), { stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  p.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const ready = new Promise<void>((resolve) => p.stdout.on('data', (d: Buffer) => ((out += d.toString()), out.includes('ready\n') && resolve())));
  const other = new Promise<{ createdFrom: string; templateBuild: string | null }>((resolve, reject) => {
    p.on('close', (code) => (code === 0 ? resolve(JSON.parse(out.trim().split('\n').pop()!)) : reject(new Error(`child exited ${code}: ${err}`))));
  });
  await Promise.race([ready, other]);
  p.stdin.write('go\n');
  const mine = await Sandbox.create(bootOpts(72));
  try {
    const theirs = await other;
    const fresh = builds().filter((b) => !keys.has(b.key));
    assert.is(fresh.length, 1, JSON.stringify(fresh));
    assert.is(theirs.createdFrom, 'template');
    assert.is(theirs.templateBuild, fresh[0]!.build);
    assert.is(JSON.parse(await readFile(join(internals(mine).dir, 'meta.json'), 'utf8')).templateBuild, fresh[0]!.build);
  } finally {
    await mine.kill();
  }
});

kvmTest('template: false boots; concurrent creates with new settings build one template', async () => {
  const cold = await Sandbox.create({ ...bootOpts(), template: false });
  try {
    const info = await cold.getInfo();
    assert.is(info.createdFrom, 'boot');
    assert.is(info.bootReason, 'template: false');
    assert.is(guestStatus(cold).syncs, 0);
    assert.is(guestStatus(cold).resumed, 0);
  } finally {
    await cold.kill();
  }
  const keys = new Set(builds().map((b) => b.key));
  const many = await Promise.all([0, 1, 2].map(() => Sandbox.create(bootOpts(80))));
  try {
    const fresh = builds().filter((b) => !keys.has(b.key));
    assert.is(fresh.length, 1, JSON.stringify(fresh));
    for (const s of many) assert.is((await s.getInfo()).createdFrom, 'template');
  } finally {
    await Promise.all(many.map((s) => s.kill()));
  }
});

test.run();
