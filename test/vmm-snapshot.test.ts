// Machine snapshots with guest/testvm: pause quiescing the devices, capture
// and restore (in this process and in a child Node process), memory diff
// layers, corrupt snapshots refused before any guest runs.
import { spawn, spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, existsSync, mkdtempSync, openSync, readdirSync, readFileSync, readlinkSync, readSync, rmSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';

import * as assert from 'uvu/assert';
import { test } from 'uvu';

import { readGenerationFiles, type GenerationFiles } from '../lib/store/snapshot-files.js';
import { Machine } from '../lib/vm/machine.js';
import { bootTestvm, sleep, testvmCommand, testvmSkipReason, until } from './vmm-guests.js';
import { bound, NESTED } from './bounds.js';
import { testUnless } from './skip-unless.js';
import { nodeArgs } from './child-node.js';

const kvmTest = testUnless('vmm-snapshot', testvmSkipReason(), 'kvm');

const COUNTER = 0x100008;
/** Time for a merge off the capture path to finish (emulated CPUs in the nested host). */
const MERGE_WAIT_MS = NESTED ? 3000 : 300;
const MiB = 1024 * 1024;

function tempDir(): string {
  return mkdtempSync(join(tmpdir(), 'torpor-snap-'));
}

/** A sparse disk image of `bytes` beside the test's directory (`<dir>-<name>`); the test removes it. */
function sparseBase(dir: string, name: string, bytes: number): string {
  const base = join(dir, '..', `${dir.split('/').pop()}-${name}`);
  writeFileSync(base, Buffer.alloc(0));
  truncateSync(base, bytes);
  return base;
}

function hashRam(m: Machine, bytes: number): string {
  const h = createHash('sha256');
  for (let off = 0; off < bytes; off += 16 * MiB) h.update(m.readGuest(off, Math.min(16 * MiB, bytes - off)));
  return h.digest('hex');
}


// CRC-32C (Castagnoli), as the state file's envelope uses it.
function crc32c(buf: Buffer): number {
  let crc = 0xffffffff;
  for (const b of buf) {
    crc ^= b;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0x82f63b78 : crc >>> 1;
  }
  return (crc ^ 0xffffffff) >>> 0;
}

function child(...args: string[]): string {
  const r = spawnSync(process.execPath, nodeArgs('test/fixtures/snapshot-child.ts', ...args), {
    encoding: 'utf8',
    timeout: 60_000,
  });
  if (r.status !== 0) throw new Error(`child failed (${r.status} ${r.signal}): ${r.stderr}`);
  return r.stdout;
}

kvmTest('pause quiesces vsock: host bytes sent while paused touch no guest page and arrive after resume, in order', async () => {
  const m = await bootTestvm({ vsockCid: 3, memoryMiB: 64 });
  try {
    const s = await m.vsockConnect(7);
    let got = '';
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.write('warm-up\n');
    await until(() => got === 'warm-up\n', 'the echo of warm-up');
    got = '';
    await m.pause();
    assert.is(m.state, 'paused');
    const ram = hashRam(m, 64 * MiB);
    const dirty = m.dirtyPageCount();
    const msg = Array.from({ length: 200 }, (_, i) => `line-${i}\n`).join('');
    s.write(msg);
    await sleep(300);
    assert.is(hashRam(m, 64 * MiB), ram, 'guest RAM changed while paused');
    assert.is(m.dirtyPageCount(), dirty, 'pages were dirtied while paused');
    assert.is(got, '', 'the guest echoed while paused');
    await m.resume();
    await until(() => got.length >= msg.length, 'the echo after resume');
    assert.is(got, msg);
    s.destroy();
  } finally {
    await m.stop();
  }
});

kvmTest('the counter keeps counting after a capture restored in a child Node process', async () => {
  const dir = tempDir();
  const m = await bootTestvm({ memoryMiB: 64 });
  try {
    assert.match(await testvmCommand(m, 'count start', 'count'), /running=1/);
    assert.match(await testvmCommand(m, 'echo before-capture', 'echo'), /echo=before-capture/);
    await until(() => m.readGuest(COUNTER, 8).readBigUInt64LE() > 0n, 'the counter to run');
    await m.pause();
    const saved = Number(m.readGuest(COUNTER, 8).readBigUInt64LE());
    assert.ok(saved > 0, 'the counter never ran');
    const r = await m.snapshot(dir, { stop: true });
    assert.is(r.generation, 1);
    assert.ok(r.fullLayer);
    assert.ok(r.durableMs >= r.capturedMs);
    console.log(`  capture of 64 MiB (full layer, ${r.dirtyPages} pages): captured ${r.capturedMs.toFixed(2)} ms, durable ${r.durableMs.toFixed(2)} ms, ${r.bytes} bytes`);
    const out = JSON.parse(child('counter', dir).trim().split('\n').pop()!) as {
      atRestore: number; later: number; echo: string; tail: string;
    };
    assert.is(out.atRestore, saved, 'the counter was not restored to its saved value');
    assert.ok(out.later > saved, `the counter did not advance after the restore (${out.later} <= ${saved})`);
    assert.is(out.echo, 'echo=restored child');
    assert.ok(out.tail.indexOf('echo=before-capture') < out.tail.indexOf('echo=restored child'), 'console history lost');
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

kvmTest('20 capture/restore cycles: diffs hold every page the guest or a device wrote, RAM identical after each restore', async () => {
  const dir = tempDir();
  const mem = 64;
  const base = join(dir, '..', `${dir.split('/').pop()}-cyc-base.img`);
  writeFileSync(base, Buffer.alloc(4 * MiB, 0x5a));
  const m = await bootTestvm({ memoryMiB: mem, vsockCid: 3, disks: [{ base, overlay: join(dir, 'o.overlay') }] });
  const expect = new Map<number, number>(); // page address -> tagged word
  try {
    const first = await m.snapshot(dir);
    const s = await m.vsockConnect(7);
    let echoed = 0;
    s.on('data', (d: Buffer) => (echoed += d.length));
    assert.ok(first.fullLayer);
    for (let cycle = 0; cycle < 20; cycle++) {
      const runs = 1 + (cycle % 4);
      const cyclePages = new Set<number>();
      for (let r = 0; r < runs; r++) {
        const pages = 1 + Math.floor(Math.random() * 16);
        const at = 0x1000000 + Math.floor(Math.random() * 2048) * 4096 * 4; // 16..48 MiB
        const tag = (0x5e000000 + cycle * 0x100 + r) >>> 0;
        const line = await testvmCommand(m, `mem-write 0x${tag.toString(16)} ${pages} 0x${at.toString(16)}`, 'mem-write');
        assert.match(line, /^mem-write=ok/);
        for (let i = 0; i < pages; i++) {
          const addr = at + i * 4096;
          cyclePages.add(addr);
          expect.set(addr, (tag ^ addr) >>> 0);
        }
      }
      // The block device writes guest memory (the read lands in the guest's buffer): KVM's dirty
      // log does not see it, the VMM's own bitmap must.
      assert.match(await testvmCommand(m, `blk-read ${Math.floor(Math.random() * 4096)} 8`, 'blk-read'), /^blk-read=ok/);
      // So does vsock: host bytes land in the guest's rx buffers (the echo goes out from there).
      const want = echoed + 8192;
      s.write(randomBytes(8192));
      await until(() => echoed >= want, 'the vsock echo');
      await m.pause();
      const ram = hashRam(m, mem * MiB);
      const r = await m.snapshot(dir);
      assert.not.ok(r.fullLayer);
      assert.is(r.generation, cycle + 2);
      const written = cyclePages.size;
      assert.ok(r.dirtyPages >= written, `diff has ${r.dirtyPages} pages, ${written} were written`);
      assert.ok(r.dirtyPages <= written + 64, `diff has ${r.dirtyPages} pages for ${written} written`);
      const back = await Machine.restore(dir, { state: 'paused' });
      try {
        assert.is(hashRam(back, mem * MiB), ram, `cycle ${cycle}: restored RAM differs from the captured RAM`);
        for (const [addr, word] of expect) assert.is(back.readGuest(addr, 4).readUInt32LE(), word, `page 0x${addr.toString(16)}`);
      } finally {
        await back.stop();
      }
      await m.resume();
    }
    s.destroy();
    // The chain was merged off the capture path along the way: the last generation's chain is
    // a merged layer and the diffs after it, not 21 layers.
    const manifest = JSON.parse(readFileSync(join(dir, 'gen-21', 'manifest.json'), 'utf8')) as { layers: string[] };
    assert.ok(manifest.layers[0]!.startsWith('layers/merged-'), `chain: ${manifest.layers.join(' ')}`);
    assert.ok(manifest.layers.length < 21, `chain of ${manifest.layers.length} layers`);
    // The last generation runs: the guest answers.
    const back = await Machine.restore(dir);
    assert.match(await testvmCommand(back, 'echo after-cycles', 'echo'), /echo=after-cycles/);
    await back.stop();
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
    rmSync(base, { force: true });
  }
});

kvmTest('corrupt snapshots are refused before any guest runs', async () => {
  const dir = tempDir();
  const m = await bootTestvm({ memoryMiB: 32 });
  try {
    await m.snapshot(dir, { stop: true });
    const state = join(dir, 'gen-1', 'vm.state');
    const good = readFileSync(state);
    const cases: Array<[string, () => void]> = [
      ['bit flip', () => { const b = Buffer.from(good); const i = Math.floor(b.length / 2); b[i] = b[i]! ^ 0x10; writeFileSync(state, b); }],
      ['truncated', () => { writeFileSync(state, good); truncateSync(state, good.length - 9); }],
      ['wrong version', () => { const b = Buffer.from(good); b.writeUInt32LE(999, 8); writeFileSync(state, b); }],
      ['empty', () => writeFileSync(state, Buffer.alloc(0))],
    ];
    for (const [name, corrupt] of cases) {
      corrupt();
      try {
        await Machine.restore(dir);
        assert.unreachable(`${name}: restored`);
      } catch (e) {
        assert.is((e as { code?: string }).code, 'SNAPSHOT_INVALID', `${name}: ${String(e)}`);
      }
    }
    writeFileSync(state, good);
    const ok = await Machine.restore(dir, { state: 'paused' });
    await ok.stop();
    // A missing memory layer is refused too.
    rmSync(join(dir, 'gen-1', 'mem.layer'));
    try {
      await Machine.restore(dir);
      assert.unreachable('restored without its memory layer');
    } catch (e) {
      assert.ok(['SNAPSHOT_INVALID', 'IO_ERROR'].includes((e as { code?: string }).code!), String(e));
    }
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

kvmTest('a one-shot LAPIC timer armed before the capture fires after the restore', async () => {
  const dir = tempDir();
  const m = await bootTestvm({ memoryMiB: 32 });
  try {
    m.consoleWrite('timer 1500000\n'); // 1.5 s; the guest spins until it fires
    await sleep(200);
    assert.not.match(m.consoleTail().toString(), /timer=/, 'the timer fired before the capture');
    await m.snapshot(dir, { stop: true });
    const back = await Machine.restore(dir);
    try {
      assert.match(await back.waitForConsole(/timer=\w+ [^\n]*\n/, 15_000), /^timer=ok /);
    } finally {
      await back.stop();
    }
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

kvmTest('vsock is reset at restore: the guest drops its connections, the host reconnects and echoes', async () => {
  const dir = tempDir();
  const m = await bootTestvm({ vsockCid: 3, memoryMiB: 32 });
  try {
    const s = await m.vsockConnect(7);
    let got = '';
    s.on('data', (d: Buffer) => (got += d.toString('latin1')));
    s.write('before\n');
    await until(() => got === 'before\n', 'the echo before the capture');
    await m.snapshot(dir, { stop: true });
    s.destroy();
    const back = await Machine.restore(dir);
    try {
      const t = await back.vsockConnect(7);
      let echoed = '';
      t.on('data', (d: Buffer) => (echoed += d.toString('latin1')));
      t.write('after restore\n');
      await until(() => echoed === 'after restore\n', 'the echo after the restore');
      t.destroy();
      assert.match(await testvmCommand(back, 'vsock', 'vsock'), /transport_resets=1 /);
    } finally {
      await back.stop();
    }
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

kvmTest('SIGKILL of a process capturing, at random moments: the previous generation always restores intact', async () => {
  const dir = tempDir();
  const m = await bootTestvm({ memoryMiB: 32 });
  try {
    assert.match(await testvmCommand(m, 'count start', 'count'), /running=1/);
    await m.snapshot(dir, { stop: true });
    const rounds = Number(process.env.TORPOR_SNAPSHOT_KILL_ROUNDS ?? 20);
    let generations = 0;
    for (let i = 0; i < rounds; i++) {
      const c = spawn(process.execPath, nodeArgs('test/fixtures/snapshot-child.ts', 'capture', dir, '1000'), {
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      let err = '';
      c.stdout.on('data', (d: Buffer) => (out += d.toString()));
      c.stderr.on('data', (d: Buffer) => (err += d.toString()));
      const exited = new Promise<void>((resolve) => c.on('exit', () => resolve()));
      try {
        // Wait for the child to be capturing (a Node start: slow where emulated), then kill
        // it somewhere in a capture.
        await until(() => out.includes('gen ') || c.exitCode !== null, 'the child capturing', 30_000).catch((e: Error) => {
          throw new Error(`${e.message} (round ${i}); child stderr: ${err.slice(-500)}`);
        });
        assert.ok(out.includes('gen '), `the child ended before capturing (round ${i}, exit ${c.exitCode}): ${err.slice(-500)}`);
        await sleep(Math.random() * 150);
      } finally {
        c.kill('SIGKILL'); // also on failure: a child left capturing would outlive the test
        await exited;
      }
      generations += (out.match(/gen /g) ?? []).length;
      const back = await Machine.restore(dir, { state: 'paused' });
      try {
        assert.is(back.readGuest(0x100000, 4).readUInt32LE(), 0x314d5654, 'status page magic');
        await back.resume();
        assert.match(await testvmCommand(back, `echo round-${i}`, 'echo'), new RegExp(`echo=round-${i}`));
      } finally {
        await back.stop();
      }
    }
    console.log(`  ${rounds} kills, ${generations} generations completed by the killed children`);
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

kvmTest('disk: data written before the capture reads back after the restore; each restore writes its own top layer', async () => {
  const dir = tempDir();
  const base = sparseBase(dir, 'base.img', 16 * MiB);
  const m = await bootTestvm({ memoryMiB: 32, disks: [{ base, overlay: join(dir, 'live.overlay') }] });
  try {
    assert.match(await testvmCommand(m, 'blk-write 8 0x11110000 4', 'blk-write'), /^blk-write=ok/);
    await m.snapshot(dir);
    // Written after the capture: not part of generation 1.
    assert.match(await testvmCommand(m, 'blk-write 64 0x22220000 4', 'blk-write'), /^blk-write=ok/);
    await m.stop();
    const a = await Machine.restore(dir);
    assert.match(await testvmCommand(a, 'blk-verify 8 0x11110000 4', 'blk-verify'), /^blk-verify=ok/);
    assert.match(await testvmCommand(a, 'blk-verify 64 0x22220000 4', 'blk-verify'), /^blk-verify=bad/);
    assert.match(await testvmCommand(a, 'blk-write 128 0x33330000 4', 'blk-write'), /^blk-write=ok/);
    assert.match(await testvmCommand(a, 'blk-flush', 'blk-flush'), /^blk-flush=ok/);
    await a.stop();
    // Another restore of the same generation does not see the first one's writes.
    const b = await Machine.restore(dir);
    assert.match(await testvmCommand(b, 'blk-verify 8 0x11110000 4', 'blk-verify'), /^blk-verify=ok/);
    assert.match(await testvmCommand(b, 'blk-verify 128 0x33330000 4', 'blk-verify'), /^blk-verify=bad/);
    // A second generation from the restored machine: both layers hold.
    assert.match(await testvmCommand(b, 'blk-write 256 0x44440000 4', 'blk-write'), /^blk-write=ok/);
    const g2 = await b.snapshot(dir, { stop: true });
    assert.is(g2.generation, 2);
    const c = await Machine.restore(dir);
    assert.match(await testvmCommand(c, 'blk-verify 8 0x11110000 4', 'blk-verify'), /^blk-verify=ok/);
    assert.match(await testvmCommand(c, 'blk-verify 256 0x44440000 4', 'blk-verify'), /^blk-verify=ok/);
    await c.stop();
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
    rmSync(base, { force: true });
  }
});

/** This process's fds open on files under `dir` (a machine's disk layers and tops). */
/** Open files under `dir` (directories left out: a top not yet flushed holds its directory open,
 *  to sync its entries at its first flush). */
function fdsUnder(dir: string): number {
  let n = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`).startsWith(dir + '/') && !statSync(`/proc/self/fd/${fd}`).isDirectory()) n++;
    } catch {
      // closed meanwhile
    }
  }
  return n;
}

function manifestOf(dir: string, generation: number): GenerationFiles {
  return readGenerationFiles(dir, generation);
}

// Every file under dir/layers/ is named by some generation: a merge nobody adopted (cancelled by a
// stop, or finished after it) leaves nothing behind.
function assertNoStrayMerges(dir: string, generations: number): void {
  const named = new Set<string>();
  for (let g = 1; g <= generations; g++) {
    if (!existsSync(join(dir, `gen-${g}`, 'manifest.json'))) continue; // pruned
    const m = manifestOf(dir, g);
    for (const p of [...m.memoryLayers, ...(m.disks ?? []).flat()]) named.add(p);
  }
  if (!existsSync(join(dir, 'layers'))) return;
  for (const f of readdirSync(join(dir, 'layers'), { withFileTypes: false }) as string[]) {
    const p = `layers/${f.replace(/\.map$/, '')}`;
    assert.ok(named.has(p), `${p} is named by no generation`);
  }
}

kvmTest('disk layers merge off the capture path: a machine captured 12 times holds a short chain, fewer fds, and every block', async () => {
  const dir = tempDir();
  const base = sparseBase(dir, 'merge-base.img', 16 * MiB);
  const m = await bootTestvm({ memoryMiB: 32, disks: [{ base, overlay: join(dir, 'live.overlay') }] });
  try {
    let last: Awaited<ReturnType<Machine['snapshot']>> | undefined;
    for (let g = 1; g <= 12; g++) {
      assert.match(await testvmCommand(m, `blk-write ${g * 64} 0x${(0x5000 + g).toString(16)} 8`, 'blk-write'), /^blk-write=ok/);
      await m.pause();
      last = await m.snapshot(dir);
      await m.resume();
      // A merge starts once 8 own layers are frozen; give it time to finish before the next capture.
      await sleep(g >= 8 ? MERGE_WAIT_MS : 0);
    }
    assert.ok(last);
    assert.is(last.generation, 12);
    const layers = last.diskLayers[0]!;
    // Without merges: 12 frozen layers. With them: a merged overlay and the few after it.
    assert.ok(layers.length <= 5, `disk chain of ${layers.length} layers: ${layers.join(' ')}`);
    assert.ok(layers[0]!.startsWith('layers/disk0-'), `first layer ${layers[0]}`);
    const named = manifestOf(dir, 12);
    assert.equal(named.disks, last.diskLayers, 'the manifest names the same disk layers');
    // The capture returned the generation's files, as its manifest names them, each one there.
    assert.equal(named.memoryLayers, last.memoryLayers, 'the manifest names the same memory chain');
    assert.is(named.state, last.stateFile);
    assert.is(named.manifest, last.manifest);
    assert.is(last.memoryLayers.at(-1), last.memoryLayer, "the generation's own memory layer tops its chain");
    for (const p of [last.stateFile, last.memoryLayer, last.manifest, ...last.diskLayers.flat()]) assert.ok(existsSync(join(dir, p)), p);
    // The live machine let go of the layers the merge replaced: it holds data + map of each layer
    // its generation names and of its top, no more (12 frozen layers would be 26 fds). A timeout
    // is left to the assertion, which says how many are held.
    await until(() => fdsUnder(dir) <= 2 * (layers.length + 1), 'the live machine to let go of merged layers').catch(() => undefined);
    const held = fdsUnder(dir);
    assert.ok(held <= 2 * (layers.length + 1), `${held} fds under the snapshot directory for ${layers.length} layers + a top`);
    for (let g = 1; g <= 12; g++)
      assert.match(await testvmCommand(m, `blk-verify ${g * 64} 0x${(0x5000 + g).toString(16)} 8`, 'blk-verify'), /^blk-verify=ok/, `live, write ${g}`);
    await m.stop();
    const back = await Machine.restore(dir);
    try {
      for (let g = 1; g <= 12; g++)
        assert.match(await testvmCommand(back, `blk-verify ${g * 64} 0x${(0x5000 + g).toString(16)} 8`, 'blk-verify'), /^blk-verify=ok/, `restored, write ${g}`);
    } finally {
      await back.stop();
    }
    assertNoStrayMerges(dir, 12);
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
    rmSync(base, { force: true });
  }
});

kvmTest('disk layers merge while a restored machine runs: restore -> write -> capture and stop, 14 times, the chain stays short', async () => {
  const dir = tempDir();
  const base = sparseBase(dir, 'merge2-base.img', 16 * MiB);
  const first = await bootTestvm({ memoryMiB: 32, disks: [{ base, overlay: join(dir, 'live.overlay') }] });
  await first.snapshot(dir, { stop: true });
  const lengths: number[] = [];
  for (let g = 2; g <= 15; g++) {
    const m = await Machine.restore(dir);
    try {
      assert.match(await testvmCommand(m, `blk-write ${g * 64} 0x${(0x6000 + g).toString(16)} 8`, 'blk-write'), /^blk-write=ok/);
      await sleep(MERGE_WAIT_MS); // the merge a restore starts reads a few small layers
      const r = await m.snapshot(dir, { stop: true });
      assert.is(r.generation, g);
      lengths.push(r.diskLayers[0]!.length);
    } finally {
      await m.stop();
    }
    // Nothing a cancelled or unadopted merge wrote is left; then what the merges made unneeded
    // goes (a VMM user's sweep; the sandbox store does its own).
    assertNoStrayMerges(dir, g);
    await Machine.pruneSnapshots(dir);
  }
  assert.equal(readdirSync(join(dir, 'tops')), [], 'the stopped machines\' tops were pruned');
  assert.ok(readdirSync(dir).filter((n) => n.startsWith('gen-')).length < 9, readdirSync(dir).join(' '));
  // The 8th own layer starts a merge at the next restore; the capture after adopts it.
  assert.ok(Math.max(...lengths.slice(-5)) < 9, `chain lengths ${lengths.join(' ')}`);
  assert.ok(lengths.some((n, i) => i > 0 && n < lengths[i - 1]!), `never shortened: ${lengths.join(' ')}`);
  const back = await Machine.restore(dir);
  try {
    for (let g = 2; g <= 15; g++)
      assert.match(await testvmCommand(back, `blk-verify ${g * 64} 0x${(0x6000 + g).toString(16)} 8`, 'blk-verify'), /^blk-verify=ok/, `write ${g}`);
  } finally {
    await back.stop();
    rmSync(dir, { recursive: true, force: true });
    rmSync(base, { force: true });
  }
});

kvmTest('fork: 10 children and the parent diverge in memory and on disk', async () => {
  const dir = tempDir();
  const base = sparseBase(dir, 'fork-base.img', 8 * MiB);
  const m = await bootTestvm({ memoryMiB: 32, disks: [{ base, overlay: join(dir, 'parent.overlay') }] });
  const page = 0x1400000;
  try {
    assert.match(await testvmCommand(m, 'mem-write 0x1000 1 0x1400000', 'mem-write'), /^mem-write=ok/);
    const t0 = performance.now();
    const kids = await m.fork(10, join(dir, 'fork'));
    console.log(`  fork x10 of a 32 MiB machine: ${(performance.now() - t0).toFixed(1)} ms (capture to a fresh directory, durable, then 10 restores)`);
    const all = [m, ...kids];
    try {
      await Promise.all(all.map(async (x, i) => {
        const tag = `0x${(0xa0000000 + i * 0x10000).toString(16)}`;
        assert.match(await testvmCommand(x, `mem-write ${tag} 1 0x1400000`, 'mem-write', 20_000), /^mem-write=ok/);
        assert.match(await testvmCommand(x, `blk-write 16 ${tag} 1`, 'blk-write', 20_000), /^blk-write=ok/);
      }));
      await Promise.all(all.map(async (x, i) => {
        const tag = (0xa0000000 + i * 0x10000) >>> 0;
        assert.is(x.readGuest(page, 4).readUInt32LE(), (tag ^ page) >>> 0, `machine ${i} sees another's page`);
        assert.match(await testvmCommand(x, `blk-verify 16 0x${tag.toString(16)} 1`, 'blk-verify', 20_000), /^blk-verify=ok/, `machine ${i} disk`);
      }));
    } finally {
      await Promise.all(kids.map((k) => k.stop()));
    }
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
    rmSync(base, { force: true });
  }
});

/** Every file under `dir` with its size, mtime and inode: a directory nothing wrote into compares equal. */
function stampsOf(dir: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of readdirSync(dir, { withFileTypes: true, recursive: true })) {
    if (!e.isFile()) continue;
    const p = join(e.parentPath ?? e.path, e.name);
    const st = statSync(p);
    out[p] = `${st.size}:${st.mtimeMs}:${st.ino}`;
  }
  return out;
}

kvmTest('restore({ into }): nothing written into the source; the first capture into `into` is a diff over its layers (absolute), and restores', async () => {
  const src = tempDir();
  const into = tempDir();
  const base = join(src, '..', `${src.split('/').pop()}-into-base.img`);
  writeFileSync(base, Buffer.alloc(0));
  truncateSync(base, 8 * MiB);
  const m = await bootTestvm({ memoryMiB: 32, disks: [{ base, overlay: join(src, 'live.overlay') }] });
  try {
    assert.match(await testvmCommand(m, 'blk-write 8 0x11110000 4', 'blk-write'), /^blk-write=ok/);
    await m.snapshot(src, { stop: true });
    rmSync(join(src, 'tops'), { recursive: true, force: true });
    rmSync(join(src, 'live.overlay'), { force: true });
    rmSync(join(src, 'live.overlay.map'), { force: true });
    const before = stampsOf(src);
    // Named relatively: the chain the machine keeps names the source's layers absolutely all the same.
    const a = await Machine.restore(relative(process.cwd(), src), { into });
    try {
      assert.match(await testvmCommand(a, 'blk-verify 8 0x11110000 4', 'blk-verify'), /^blk-verify=ok/);
      assert.match(await testvmCommand(a, 'blk-write 64 0x22220000 4', 'blk-write'), /^blk-write=ok/);
      assert.match(await testvmCommand(a, 'mem-write 0x5151 16 0x1400000', 'mem-write'), /^mem-write=ok/);
      const want = a.readGuest(0x1400000, 16 * 4096);
      const r = await a.snapshot(into, { stop: true });
      assert.is(r.generation, 1);
      const manifest = JSON.parse(readFileSync(join(into, 'gen-1', 'manifest.json'), 'utf8'));
      assert.is(manifest.memory.kind, 'diff');
      assert.equal(manifest.layers, [join(src, 'gen-1', 'mem.layer'), 'gen-1/mem.layer']);
      assert.ok(r.dirtyPages < 1024, `${r.dirtyPages} pages in the diff`);
      assert.equal(stampsOf(src), before, 'nothing was written into the source directory');
      // The sandbox's generation restores (its chain reaches into the source by absolute path).
      const b = await Machine.restore(into);
      try {
        assert.equal(b.readGuest(0x1400000, 16 * 4096), want);
        assert.match(await testvmCommand(b, 'blk-verify 8 0x11110000 4', 'blk-verify'), /^blk-verify=ok/);
        assert.match(await testvmCommand(b, 'blk-verify 64 0x22220000 4', 'blk-verify'), /^blk-verify=ok/);
        // And continues the chain there: the next capture is a diff over both.
        const r2 = await b.snapshot(into, { stop: true });
        const m2 = JSON.parse(readFileSync(join(into, 'gen-2', 'manifest.json'), 'utf8'));
        assert.is(r2.generation, 2);
        assert.equal(m2.layers, [join(src, 'gen-1', 'mem.layer'), 'gen-1/mem.layer', 'gen-2/mem.layer']);
      } finally {
        await b.stop();
      }
      // A changed source layer is refused (its identity no longer matches the diff's parent).
      const layer = join(src, 'gen-1', 'mem.layer');
      const bytes = readFileSync(layer);
      bytes[100]! ^= 0xff; // inside the header page: its checksum
      writeFileSync(layer, bytes);
      const err = await Machine.restore(into).catch((e: unknown) => e);
      assert.is((err as { code?: string }).code, 'SNAPSHOT_INVALID', String(err));
    } finally {
      await a.stop();
    }
  } finally {
    await m.stop();
    rmSync(src, { recursive: true, force: true });
    rmSync(into, { recursive: true, force: true });
    rmSync(base, { force: true });
  }
});

kvmTest('a snapshot from another host kind is refused as incompatible before any guest runs', async () => {
  const dir = tempDir();
  const m = await bootTestvm({ memoryMiB: 32 });
  try {
    await m.snapshot(dir, { stop: true });
    const state = join(dir, 'gen-1', 'vm.state');
    const good = readFileSync(state);
    assert.is(good.readUInt32LE(good.length - 4), crc32c(good.subarray(0, good.length - 4)), 'envelope checksum');
    // The fingerprint follows the 32-byte header (its length at offset 16); its host kind is a
    // length-prefixed string. Swap it for the other kind and re-seal the file.
    const fpLen = good.readUInt32LE(16);
    const fp = good.subarray(32, 32 + fpLen);
    const kind = fp.indexOf('pvm') >= 0 ? 'pvm' : 'hardware';
    const other = Buffer.from(kind === 'pvm' ? 'hardware' : 'pvm', 'latin1');
    const at = fp.indexOf(kind);
    assert.is(fp.readUInt32LE(at - 4), kind.length, 'host kind string prefix');
    const newFp = Buffer.concat([fp.subarray(0, at - 4), Buffer.alloc(4), other, fp.subarray(at + kind.length)]);
    newFp.writeUInt32LE(other.length, at - 4);
    const header = Buffer.from(good.subarray(0, 32));
    header.writeUInt32LE(newFp.length, 16);
    const sealed = Buffer.concat([header, newFp, good.subarray(32 + fpLen, good.length - 4)]);
    const forged = Buffer.concat([sealed, Buffer.alloc(4)]);
    forged.writeUInt32LE(crc32c(sealed), sealed.length);
    writeFileSync(state, forged);
    try {
      await Machine.restore(dir);
      assert.unreachable('restored a snapshot of another host kind');
    } catch (e) {
      assert.is((e as { code?: string }).code, 'SNAPSHOT_INCOMPATIBLE', String(e));
    }
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

kvmTest('vCPU, irqchip, PIT, clock and device state survive a round trip byte for byte', async () => {
  const dir = tempDir();
  const base = sparseBase(dir, 'rt-base.img', 4 * MiB);
  const m = await bootTestvm({ memoryMiB: 32, vsockCid: 7, rng: true, disks: [{ base, overlay: join(dir, 'o.overlay') }] });
  try {
    assert.match(await testvmCommand(m, 'rng 16', 'rng'), /^rng=/);
    assert.match(await testvmCommand(m, 'blk-write 0 0x12340000 1', 'blk-write'), /^blk-write=ok/);
    // KVM's timers run on while vCPUs are out of KVM_RUN: compare what was saved with what
    // the restored machine holds at once, not two reads some time apart.
    await m.snapshot(dir, { stop: true });
    const before = Machine.describeSnapshot(dir);
    const back = await Machine.restore(dir, { state: 'paused' });
    try {
      const after = back.stateParts();
      assert.equal(Object.keys(after).sort(), Object.keys(before).sort(), 'the same parts');
      const moved: string[] = [];
      for (const [name, a] of Object.entries(before)) {
        const b = after[name]!;
        // Time runs on while the machine is saved: the TSC and kvmclock move forward (never back).
        if (name === 'vm.clock' || /\.msr\.0x10$/.test(name)) {
          assert.ok(b.readBigUInt64LE() >= a.readBigUInt64LE(), `${name} went backwards`);
          continue;
        }
        // kvm_pit_channel_state.count_load_time (s64 at 16 in each 24-byte channel) is the host's
        // clock when the count was loaded: a restore loads it again.
        if (name === 'vm.pit') {
          const [x, y] = [Buffer.from(a), Buffer.from(b)];
          for (let c = 0; c < 3; c++) for (const z of [x, y]) z.fill(0, c * 24 + 16, c * 24 + 24);
          if (!x.equals(y)) moved.push(name);
          continue;
        }
        if (!a.equals(b)) moved.push(name);
      }
      assert.equal(moved, [], `parts that differ after the round trip: ${moved.join(', ')}`);
      await back.resume();
      assert.match(await testvmCommand(back, 'blk-verify 0 0x12340000 1', 'blk-verify'), /^blk-verify=ok/);
    } finally {
      await back.stop();
    }
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
    rmSync(base, { force: true });
  }
});

kvmTest('Machine.build creates on a worker thread; the machine boots and stops (on the thread pool too)', async () => {
  const { testvmImage } = await import('./vmm-guests.js');
  const m = await Machine.build({ kernel: testvmImage()!, vcpus: 1, memoryMiB: 32 });
  assert.is(m.state, 'created');
  await m.start();
  await m.waitForConsole(/boot=ok[^\n]*\n/, 10_000);
  assert.match(await testvmCommand(m, 'echo built', 'echo'), /echo=built/);
  const stopping = m.stop();
  assert.throws(() => m.readGuest(0, 4), /stopped/);
  assert.is((await stopping).kind, 'stop');
  try {
    await Machine.build({ kernel: '/nonexistent/kernel', memoryMiB: 32 });
    assert.unreachable('built a machine without a kernel');
  } catch (e) {
    assert.is((e as { code?: string }).code, 'BOOT_FAILED', String(e));
  }
});

kvmTest('a snapshot into a directory that cannot be written fails with IO_ERROR and the machine runs on', async () => {
  const m = await bootTestvm({ memoryMiB: 32 });
  try {
    try {
      await m.snapshot('/proc/torpor-cannot-write-here');
      assert.unreachable('captured into /proc');
    } catch (e) {
      assert.is((e as { code?: string }).code, 'IO_ERROR', String(e));
    }
    assert.match(await testvmCommand(m, 'echo still-here', 'echo'), /echo=still-here/);
  } finally {
    await m.stop();
  }
});

kvmTest('every page the host copied on write after a restore (/proc/self/pagemap) is in the next diff', async () => {
  const dir = tempDir();
  const m = await bootTestvm({ memoryMiB: 64, vsockCid: 3, rng: true });
  try {
    await m.snapshot(dir, { stop: true });
    const back = await Machine.restore(dir);
    try {
      for (let i = 0; i < 6; i++) {
        const at = 0x1000000 + Math.floor(Math.random() * 1024) * 4096 * 8;
        assert.match(await testvmCommand(back, `mem-write 0x${(0x77000000 + i).toString(16)} ${1 + i} 0x${at.toString(16)}`, 'mem-write'), /^mem-write=ok/);
      }
      assert.match(await testvmCommand(back, 'rng 32', 'rng'), /^rng=/);
      const s = await back.vsockConnect(7);
      let got = 0;
      s.on('data', (d: Buffer) => (got += d.length));
      s.write(randomBytes(4096));
      await until(() => got >= 4096, 'the vsock echo');
      s.destroy();
      await back.pause();
      const dirty = back.dirtyPageBitmap();
      // Guest RAM is the layer file mapped MAP_PRIVATE at its data offset (4096): a page of it the
      // host copied on write is present and no longer a file page (pagemap bit 61 clear).
      const layer = join(dir, 'gen-1', 'mem.layer');
      const maps = readFileSync('/proc/self/maps', 'utf8').split('\n').filter((l) => l.endsWith(layer));
      assert.ok(maps.length >= 1, 'the memory layer is not mapped');
      const pagemap = openSync('/proc/self/pagemap', 'r');
      let cow = 0;
      const missing: number[] = [];
      try {
        for (const line of maps) {
          const [range, , offset] = line.split(/\s+/);
          const [lo, hi] = range!.split('-').map((h) => BigInt(`0x${h}`));
          const firstPage = (Number.parseInt(offset!, 16) - 4096) / 4096;
          const pages = Number((hi! - lo!) / 4096n);
          const entries = Buffer.alloc(pages * 8);
          readSync(pagemap, entries, 0, entries.length, Number((lo! / 4096n) * 8n));
          for (let p = 0; p < pages; p++) {
            const e = entries.readBigUInt64LE(p * 8);
            const present = (e >> 63n) & 1n;
            const filePage = (e >> 61n) & 1n;
            if (!present || filePage) continue;
            cow++;
            const page = firstPage + p;
            if (!((dirty[page >> 3]! >> (page & 7)) & 1)) missing.push(page);
          }
        }
      } finally {
        closeSync(pagemap);
      }
      assert.ok(cow > 0, 'no page was copied on write');
      assert.equal(missing.slice(0, 8), [], `${missing.length} of ${cow} copied pages are not in the dirty set`);
      const r = await back.snapshot(dir);
      assert.ok(r.dirtyPages >= cow, `diff of ${r.dirtyPages} pages, ${cow} copied on write`);
    } finally {
      await back.stop();
    }
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
