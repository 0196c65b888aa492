// A real Linux guest across machine snapshots: long mode, MSRs, kvmclock, the
// LAPIC timer, the irqchip and virtio-blk/vsock driven by Linux's own drivers.
// Our kernel and rootfs boot until the agent knocks (docs/protocol.md) and are captured;
// then a chain of child Node processes each restores the latest generation,
// dials the agent again over vsock (the guest's old connection was reset),
// PINGs, runs a command that appends to a file on disk and reads the uptime,
// and captures the next generation (a diff layer) as it stops. Another guest
// is captured in the middle of its boot and restored in a child, whose
// console must continue to the agent's start, which knocks.
// Runs where a Linux guest can boot (a hardware-virtualization host, e.g. the
// nested host of `npm run test:linux`); elsewhere registered as skipped,
// category linux-guest, with the reason.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { createAgentApi } from '../lib/sandbox/agent-api.js';
import type { CommandResult } from '../lib/sandbox/commands.js';
import { AGENT_KNOCK_PORT, GUEST_CID, GUEST_CMDLINE, awaitBootedAgent, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { Machine, type SnapshotResult } from '../lib/vm/machine.js';
import { chainCommand } from './fixtures/linux-snapshot-child.js';
import { NESTED } from './bounds.js';
import { testUnless } from './skip-unless.js';
import { nodeArgs } from './child-node.js';

const support = await linuxGuestSupport();
const linuxTest = testUnless(
  'vmm-linux-snapshot',
  support.ok ? null : `this host cannot boot a Linux guest: ${support.reason}`,
  'linux-guest',
);

/** Restores in a row, each in its own child process (the issue asks for 20). */
const CHAIN = 20;
/** Everything may run emulated (the nested host): generous bounds, no timing asserted. */
const BOOT_TIMEOUT_MS = 600_000;
const CHILD_TIMEOUT_MS = 600_000;
/** The line the agent prints for humans once it listens (the host waits for its knock instead). */
const READY_LINE = /torpor-agent ready v1 /;

async function artifacts(): Promise<{ kernel: string; rootfs: string }> {
  const { ensureArtifacts } = await import('../lib/setup/artifacts.js');
  const a = await ensureArtifacts({});
  return { kernel: a.kernel, rootfs: a.rootfs };
}

/**
 * In the nested host the kernel's stall detectors at their longest (RCU 300 s, soft lockup 120 s).
 * There the guest's vCPUs are threads of an emulated L1 that shares a core with another: in a CI
 * run whose test-guest files also failed for want of CPU in the same minutes (a counter that did
 * not move in 100 ms, a console flood past 120 s), a restored guest's CPU took 24,427 ticks (98 s
 * at HZ=250) in one RCU grace period and printed a self-detected stall. At the default 21 s that
 * measures the emulator's share of the core, not the restore; on a host with KVM they stay at
 * their defaults, and everywhere a restore that loses a timer still fails the agent's PING.
 */
const NESTED_DETECTORS = 'rcupdate.rcu_cpu_stall_timeout=300 watchdog_thresh=60';

function bootLinux(a: { kernel: string; rootfs: string }, work: string, cmdline: string): Machine {
  return Machine.create({
    kernel: a.kernel,
    cmdline: NESTED ? `${cmdline} ${NESTED_DETECTORS}` : cmdline,
    vcpus: 2,
    memoryMiB: 256,
    disks: [{ base: a.rootfs, overlay: join(work, 'overlay') }],
    vsockCid: GUEST_CID,
    vsockKnockPorts: [AGENT_KNOCK_PORT],
  });
}

/** Runs the fixture in a child Node process; resolves to the JSON object on its last stdout line. */
function child<T>(...args: string[]): Promise<T> {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, nodeArgs('test/fixtures/linux-snapshot-child.ts', ...args), {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    p.stdout.on('data', (d: Buffer) => (out += d.toString()));
    p.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const timer = setTimeout(() => p.kill('SIGKILL'), CHILD_TIMEOUT_MS);
    p.on('close', (code, signal) => {
      clearTimeout(timer);
      if (code !== 0) return reject(new Error(`child ${args.join(' ')} failed (${code} ${signal}):\n${err.slice(-4000)}`));
      try {
        resolve(JSON.parse(out.trim().split('\n').pop()!) as T);
      } catch {
        reject(new Error(`child ${args.join(' ')} printed no JSON: ${out.slice(-2000)}\n${err.slice(-2000)}`));
      }
    });
  });
}

/** What chainCommand printed: the chain file's lines, the clocksource, the uptime in seconds. */
function chainOutput(stdout: string): { chain: string[]; clocksource: string; uptime: number } {
  const lines = stdout.trim().split('\n');
  const m = /^(\d+\.\d+) \d+\.\d+$/.exec(lines.at(-1) ?? '');
  assert.ok(m && lines.length >= 3, `unexpected output ${JSON.stringify(stdout)}`);
  return { chain: lines.slice(0, -2), clocksource: lines.at(-2)!, uptime: Number(m![1]) };
}

/** Kernel messages of a guest in trouble (oops, lockup and RCU stall detectors, a clocksource given up). */
const KERNEL_TROUBLE = /BUG:|Oops|soft lockup|hard LOCKUP|rcu_\w+ detected stalls|self-detected stall|Kernel panic|unstable/;

linuxTest(`a Linux guest at agent-ready, restored in a child Node process ${CHAIN} times in a row: PING and a command after a vsock reconnect, then captured again`, async () => {
  const a = await artifacts();
  const work = mkdtempSync(join(tmpdir(), 'torpor-linux-snap-'));
  const dir = join(work, 'snap');
  const m = bootLinux(a, work, GUEST_CMDLINE);
  try {
    await m.start();
    const client = await awaitBootedAgent(m, BOOT_TIMEOUT_MS);
    let first: CommandResult;
    try {
      await client.ping(BOOT_TIMEOUT_MS);
      first = (await createAgentApi(client).commands.run(chainCommand(0))) as CommandResult;
      // Captured with the agent's connection open: the restored guest must drop it and listen again.
      const gen = await m.snapshot(dir, { stop: true });
      assert.is(gen.generation, 1);
      assert.ok(gen.fullLayer);
    } finally {
      await client.close();
    }
    const boot = chainOutput(first.stdout);
    assert.equal(boot.chain, ['g0']);
    let uptime = boot.uptime;
    console.log(`  vmm-linux-snapshot: guest clocksource ${boot.clocksource}`);

    const started = performance.now();
    for (let n = 1; n <= CHAIN; n++) {
      const r = await child<SnapshotResult & { restoreMs: number; pingMs: number; stdout: string; after: string }>('agent', dir, String(n));
      const out = chainOutput(r.stdout);
      // The file written before each capture is there after each restore: disk layers and the
      // guest's page cache both came through.
      assert.equal(out.chain, Array.from({ length: n + 1 }, (_, i) => `g${i}`), `restore ${n}: /var/tmp/chain`);
      // The guest's clock continued (kvmclock: no step back, no switch to another clocksource).
      assert.ok(out.uptime > uptime, `restore ${n}: uptime went from ${uptime} to ${out.uptime}`);
      assert.is(out.clocksource, boot.clocksource, `restore ${n}: the clocksource changed`);
      uptime = out.uptime;
      // The kernel printed no error after the restore (the console shows errors and worse).
      assert.not.match(r.after, KERNEL_TROUBLE, `restore ${n}: the kernel complained: ${r.after.slice(-1500)}`);
      assert.is(r.generation, n + 1);
      assert.not.ok(r.fullLayer, `restore ${n}: the capture wrote a full layer, not a diff`);
      assert.ok(r.dirtyPages > 0, `restore ${n}: an empty diff after running a command`);
    }
    const perRestore = (performance.now() - started) / CHAIN;
    console.log(`  vmm-linux-snapshot: ${CHAIN} restore/PING/command/capture children, ${perRestore.toFixed(0)} ms each (emulated where nested: not a performance figure)`);
  } finally {
    await m.stop();
    rmSync(work, { recursive: true, force: true });
  }
});

linuxTest('a Linux guest captured in the middle of its boot, restored in a child Node process: its console continues to the agent\'s readiness line', async () => {
  const a = await artifacts();
  const work = mkdtempSync(join(tmpdir(), 'torpor-linux-snap-'));
  const dir = join(work, 'snap');
  // Without `quiet`: the kernel's messages show how far the boot got on each side of the capture.
  const m = bootLinux(a, work, GUEST_CMDLINE.replace(/ quiet$/, ''));
  try {
    await m.start();
    // Both CPUs are up; the virtio drivers, the root mount and init are still to come.
    await m.waitForConsole(/smp: Brought up \d+ nodes?, 2 CPUs/, BOOT_TIMEOUT_MS);
    await m.snapshot(dir, { stop: true });
    const before = m.consoleTail().toString('latin1');
    assert.not.match(before, READY_LINE, 'the boot was already over at the capture');
    assert.not.match(before, /Run \/usr\/sbin\/torpor-agent as init process/);

    const r = await child<{ after: string; uname: string; pingMs: number }>('boot', dir);
    // What the kernel printed after the restore is the rest of the same boot: no second
    // "Linux version" banner, the root filesystem mounted, init started, the agent ready.
    assert.not.match(r.after, /Linux version/, 'the guest booted again instead of continuing');
    assert.match(r.after, /Run \/usr\/sbin\/torpor-agent as init process/);
    assert.match(r.after, READY_LINE);
    assert.match(r.uname, /^Linux \d+\.\d+/);
    assert.not.match(r.after, KERNEL_TROUBLE, `the kernel complained after the restore: ${r.after.slice(-1500)}`);
  } finally {
    await m.stop();
    rmSync(work, { recursive: true, force: true });
  }
});

test.run();
