// The VM shell pool behind Machine.restore (native/vmm/vm_pool.h): a restore
// takes a VM built ahead and the guest continues exactly as from a VM built on
// the spot; the pool is bounded, gives its fds back when turned off, and a
// process holding shells exits at once.
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import * as assert from 'uvu/assert';
import { test } from 'uvu';

import { Machine } from '../lib/vm/machine.js';
import { bootTestvm, sleep, testvmCommand, testvmSkipReason } from './vmm-guests.js';
import { bound } from './bounds.js';
import { testUnless } from './skip-unless.js';
import { moduleSpecifier, nodeEvalArgs } from './child-node.js';

const kvmTest = testUnless('vmm-restore-pool', testvmSkipReason(), 'kvm');
const COUNTER = 0x100008;
const fdCount = () => readdirSync('/proc/self/fd').length;
const counter = (m: Machine) => m.readGuest(COUNTER, 8).readBigUInt64LE();

async function until(cond: () => boolean, ms = 10_000): Promise<boolean> {
  const deadline = Date.now() + bound(ms);
  while (!cond() && Date.now() < deadline) await sleep(2);
  return cond();
}

kvmTest('a restore from a pooled VM shell continues the guest; depth 0 drops the idle shells and their fds', async () => {
  const before = Machine.restorePool();
  const dir = mkdtempSync(join(tmpdir(), 'torpor-pool-'));
  try {
    // Earlier files in this process (sandbox-pause, vmm-snapshot) restored machines, so the pool
    // may hold their shells: start from an empty pool and a RAM size no other test restores.
    Machine.restorePool({ depth: 0 });
    Machine.restorePool({ depth: 2 });
    const m = await bootTestvm({ memoryMiB: 232 });
    await testvmCommand(m, 'count start', 'count');
    await m.snapshot(dir, { stop: true });
    const fds = fdCount();
    // The first restore of a size builds its own VM and asks the pool for shells.
    const first = await Machine.restore(dir, { state: 'paused' });
    assert.ok('VM shell: none ready' in first.stats().buildPhasesMs, JSON.stringify(first.stats().buildPhasesMs));
    const saved = counter(first);
    await first.stop();
    // Two for this size (more when the pool also refilled the size an earlier file restored).
    assert.ok(await until(() => Machine.restorePool().idle >= 2), `idle shells: ${Machine.restorePool().idle}`);
    await sleep(200);
    const settled = Machine.restorePool().idle;
    assert.ok(settled === 2 || settled === 4, `idle shells: ${settled} (depth 2 per size, at most two sizes)`);
    // Bounded: nothing more is built while nobody takes.
    await sleep(50);
    assert.is(Machine.restorePool().idle, settled);

    const r = await Machine.restore(dir);
    assert.ok('VM shell from the pool' in r.stats().buildPhasesMs, JSON.stringify(r.stats().buildPhasesMs));
    // Counting resumes from the saved value, on the layer mapped over the shell's RAM.
    assert.ok(await until(() => counter(r) > saved), 'the counter did not advance');
    assert.ok(counter(r) - saved < 1n << 40n, 'the counter restarted elsewhere');
    assert.match(await testvmCommand(r, 'echo pooled', 'echo'), /pooled/);
    assert.ok((await until(() => r.stats().firstExitAtNs > 0n)), 'no exit recorded');
    await r.stop();

    Machine.restorePool({ depth: 0 });
    assert.is(Machine.restorePool().idle, 0);
    // Each idle shell held two fds (/dev/kvm, the VM); the reaper closes them.
    assert.ok(await until(() => fdCount() <= fds, 5000), `fds ${fds} -> ${fdCount()}`);
    const off = await Machine.restore(dir, { state: 'paused' });
    assert.ok('VM shell: none ready' in off.stats().buildPhasesMs);
    await off.stop();
  } finally {
    Machine.restorePool({ depth: before.depth });
    rmSync(dir, { recursive: true, force: true });
  }
});

/** Runs `script` in a child Node and times its exit from the moment its stdout's last line arrived. */
function runTimingExit(script: string, limitMs: number) {
  return new Promise<{ status: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string; exitAfterLineMs: number }>((resolve, reject) => {
    const c = spawn(process.execPath, nodeEvalArgs(script), {
      env: { ...process.env, TORPOR_RESTORE_POOL: '2' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    let lineAt = 0;
    c.stdout.setEncoding('utf8').on('data', (d: string) => {
      stdout += d;
      if (stdout.endsWith('\n')) lineAt = Date.now();
    });
    c.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = setTimeout(() => c.kill('SIGKILL'), limitMs);
    c.on('error', reject);
    c.on('close', (status, signal) => {
      clearTimeout(timer);
      resolve({ status, signal, stdout, stderr, exitAfterLineMs: lineAt ? Date.now() - lineAt : -1 });
    });
  });
}

kvmTest('a process holding pooled VM shells exits at once (natural end and process.exit)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-pool-exit-'));
  try {
    const m = await bootTestvm({ memoryMiB: 64 });
    await m.snapshot(dir, { stop: true });
    // A process that never ends is stopped here; its exit itself is timed from its last line.
    const limitMs = bound(30_000);
    for (const end of ['natural', 'exit']) {
      const script = `
        import { Machine } from ${JSON.stringify(moduleSpecifier('lib/vm/machine.ts'))};
        const r = await Machine.restore(${JSON.stringify(dir)});
        await r.stop();
        const deadline = Date.now() + 60000;
        while (Machine.restorePool().idle === 0 && Date.now() < deadline) await new Promise((s) => setTimeout(s, 2));
        console.log('idle=' + Machine.restorePool().idle);
        ${end === 'exit' ? 'process.exit(0);' : ''}`;
      const c = await runTimingExit(script, limitMs);
      assert.is(c.signal, null, `${end}: still running ${limitMs / 1000} s after it started (killed); stderr: ${c.stderr}`);
      assert.is(c.status, 0, `${end}: status ${c.status}\n${c.stderr}`);
      assert.match(c.stdout, /idle=[12]/, `${end}: ${c.stdout}`);
      // From its last line to its end: holding shells must not keep it alive or stall its exit.
      // Node's start and the restore before that line are not what this measures.
      assert.ok(c.exitAfterLineMs < bound(5000), `${end}: exited ${c.exitAfterLineMs} ms after its last line`);
      console.log(`  vmm-restore-pool: ${end}: exited ${c.exitAfterLineMs} ms after its last line`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test.run();
