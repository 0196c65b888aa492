// A stopped machine gives back what it held at stop(), not at garbage
// collection: guest memory, KVM fds, eventfds, the epoll fd, device fds and
// threads. A process that creates and stops machines in a loop stays flat.
// After stop() only state, exitReason, consoleTail and stats still answer.
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { loadNative } from '../lib/native.js';
import { Machine } from '../lib/vm/machine.js';
import { COUNTER_GPA, PVH_BANNER, kvmSkipReason, pvhElf32, until, writeTemp } from './vmm-guests.js';
import { bound } from './bounds.js';
import { testUnless } from './skip-unless.js';
import { nodeArgs } from './child-node.js';

const kvmTest = testUnless('vmm-lifecycle', kvmSkipReason(), 'kvm');

const pvh = writeTemp('pvh.elf', pvhElf32());

const fdCount = () => readdirSync('/proc/self/fd').length;
const threadCount = () => readdirSync('/proc/self/task').length;
function vmSizeKiB(): number {
  const m = /VmSize:\s+(\d+) kB/.exec(readFileSync('/proc/self/status', 'utf8'));
  return m ? Number(m[1]) : 0;
}

// The kernel's VM teardown runs on the addon's reaper thread after stop()
// (at most a few machines behind): wait for the counts to settle. A timeout is left to the
// caller's assertion, which says by how much.
async function settled(read: () => number, limit: number): Promise<number> {
  await until(() => read() <= limit, 'the counts to settle', 5000).catch(() => undefined);
  return read();
}

async function expectCode(fn: () => unknown, code: string) {
  try {
    await fn();
  } catch (err) {
    assert.instance(err, TorporError, String(err));
    assert.is((err as TorporError).code, code, (err as Error).message);
    return;
  }
  assert.unreachable(`expected ${code}`);
}

async function cycle(i: number): Promise<void> {
  // Every fourth machine carries virtio devices too (ioeventfds, irqfds, a timerfd).
  const devices = i % 4 === 0 ? { vsockCid: 3, rng: true } : {};
  const m = Machine.create({ kernel: pvh, vcpus: 1 + (i % 2), memoryMiB: 32, ...devices });
  await m.start();
  if (i % 8 === 0) await m.waitForConsole(PVH_BANNER, 5000);
  await m.stop();
}

kvmTest('200 create/start/stop cycles leave fds, threads and mappings where they were', async () => {
  await cycle(0); // the first machine loads the addon and caches KVM's CPUID
  const fds = fdCount(), threads = threadCount(), vm = vmSizeKiB();
  const t0 = performance.now();
  for (let i = 0; i < 200; i++) await cycle(i);
  const ms = performance.now() - t0;
  const fdsAfter = await settled(fdCount, fds + 2);
  const threadsAfter = await settled(threadCount, threads + 1);
  console.log(`  vmm-lifecycle: 200 cycles in ${ms.toFixed(0)} ms (${(ms / 200).toFixed(1)} ms each); fds ${fds} -> ${fdsAfter}, threads ${threads} -> ${threadsAfter}, VmSize +${((vmSizeKiB() - vm) / 1024).toFixed(0)} MiB`);
  assert.ok(fdsAfter <= fds + 2, `fds grew from ${fds} to ${fdsAfter}`);
  assert.ok(threadsAfter <= threads + 1, `threads grew from ${threads} to ${threadsAfter}`);
  // 200 x 32 MiB of guest RAM would be 6400 MiB of address space if kept.
  assert.ok(vmSizeKiB() - vm < 512 * 1024, `VmSize grew by ${vmSizeKiB() - vm} KiB`);
});

kvmTest('a stopped machine nobody holds is collected (its native object too): 40 machines, at most 2 left after GC', async () => {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const refs: WeakRef<Machine>[] = [];
  for (let i = 0; i < 40; i++) {
    const m = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 32, ...(i % 2 ? { vsockCid: 3 } : {}) });
    await m.start();
    await m.stop();
    refs.push(new WeakRef(m));
  }
  // Finalizers run on later turns of the event loop. A timeout is left to the assertion below,
  // which says how many are left.
  const alive = () => refs.filter((r) => r.deref()).length;
  const collected = () => {
    gc();
    return alive() <= 2;
  };
  await until(collected, 'the stopped machines to be collected', 2000).catch(() => undefined);
  // Before the fix, the event bridge held the JS listener (and through it every machine) forever:
  // all 40 stayed. V8 may keep the first and the last object it saw a little longer (here: 2).
  const left = alive();
  assert.ok(left <= 2, `${left} of 40 stopped machines still reachable`);
});

kvmTest('after stop: state, exitReason, consoleTail and stats answer; guest memory is gone', async () => {
  const fds = fdCount();
  const m = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16, vsockCid: 5 });
  await m.start();
  await m.waitForConsole(PVH_BANNER, 5000);
  const r = await m.stop();
  assert.is(r.kind, 'stop');
  assert.is(m.state, 'stopped');
  assert.is(m.exitReason?.kind, 'stop');
  assert.match(m.consoleTail().toString(), PVH_BANNER);
  assert.ok(m.stats().pioExits > 0, 'stats survive the stop');
  assert.match(m.kernelCmdline, /virtio_mmio\.device=/);
  await expectCode(() => m.readGuest(0, 4), 'INVALID_STATE');
  await expectCode(() => m.vsockConnect(1234, 100), 'INVALID_STATE');
  await expectCode(() => m.start(), 'INVALID_STATE');
  assert.is((await m.stop()).kind, 'stop', 'stop stays idempotent');
  assert.ok((await settled(fdCount, fds)) <= fds, `fds ${fds} -> ${fdCount()}`);
});

kvmTest('a machine the guest ended keeps its memory readable until stop(), then releases it', async () => {
  const fds = fdCount();
  const m = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16 });
  // Machines do not keep the event loop alive (docs/architecture.md#threads): the timer does.
  const ended = new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no exit event within 10 s')), 10_000);
    m.once('exit', (_s, r) => {
      clearTimeout(timer);
      resolve(r.kind);
    });
  });
  await m.start();
  await m.waitForConsole(PVH_BANNER, 5000);
  m.consoleWrite('r'); // the fixture resets through the i8042
  assert.is(await ended, 'reset');
  assert.is(m.readGuest(0x100000, 2).toString('hex'), '66ba', 'post-mortem read of the kernel image');
  assert.is((await m.stop()).kind, 'reset', 'stop reports the guest\'s reason');
  await expectCode(() => m.readGuest(0x100000, 2), 'INVALID_STATE');
  assert.ok((await settled(fdCount, fds)) <= fds, `fds ${fds} -> ${fdCount()}`);
});

kvmTest('vsock guest CIDs: 3..0xfffffffe; 0xffffffff (VMADDR_CID_ANY) is refused by both layers', async () => {
  await expectCode(() => Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16, vsockCid: 0xffffffff }), 'INVALID_ARGUMENT');
  // lib checks the option (INVALID_ARGUMENT); the addon, driven directly, asserts it: a broken
  // precondition is an internal error, never a VM with a reserved CID.
  const native = loadNative();
  const raw = { kernel: pvh, cmdline: '', vcpus: 1, memoryMiB: 16, disks: [], vsockCid: 0xffffffff };
  await expectCode(() => new native.Machine(raw, () => {}), 'INTERNAL');
  const ok = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16, vsockCid: 0xfffffffe });
  await ok.stop();
});

kvmTest('errors the kernel reported carry its errno next to the stable code', async () => {
  const codeAndErrno = async (fn: () => unknown) => {
    try {
      await fn();
    } catch (err) {
      assert.instance(err, TorporError, String(err));
      return [(err as TorporError).code, (err as TorporError).errno];
    }
    return assert.unreachable('expected an error');
  };
  assert.equal(await codeAndErrno(() => Machine.create({ kernel: '/nonexistent/vmlinux', vcpus: 1, memoryMiB: 16 })), ['BOOT_FAILED', 2]);
  assert.equal(await codeAndErrno(() => Machine.create({ kernel: pvh, kvmDevice: '/nonexistent/kvm' })), ['KVM_UNAVAILABLE', 2]);
});

// A pause the host resumes from before it completed, then a new pause: a
// vCPU's late acknowledgement of the first must not count for the second
// (the second would resolve with the other vCPU still running). The native
// binding is driven directly: lib/vm serialises pause and resume.
kvmTest('pause, resume, pause: each pause resolves only with every vCPU parked', async () => {
  const native = loadNative();
  const m = new native.Machine({ kernel: pvh, cmdline: '', vcpus: 2, memoryMiB: 16, disks: [] }, () => {});
  const counter = () => m.readGuest(COUNTER_GPA, 4).readUInt32LE();
  await m.start();
  await until(() => counter() > 0, 'the guest to count', 5000);
  for (let i = 0; i < 100; i++) {
    const first = m.pause().catch(() => undefined); // abandoned by the resume below
    if (i % 2) await new Promise((r) => setImmediate(r));
    await m.resume();
    await first;
    await m.pause();
    const a = counter();
    for (let spin = 0; spin < 2000; spin++); // the guest counts in ~us when running
    await new Promise((r) => setTimeout(r, 1));
    assert.is(counter(), a, `iteration ${i}: the counter moved while paused`);
    await m.resume();
  }
  await m.stop();
});

kvmTest('machines started paused, 8 vCPUs each kicked while its thread starts: 500 in a child process, none deadlocks', () => {
  // The kick signal's handler must not touch thread-local storage (native/vmm/kick_signal.cc):
  // before the fix a sandbox restore hung about once in twenty under load, and this child about once in four runs.
  // A deadlock never ends; the bound only says when to stop waiting (5 s here on PVM, 50 s in the
  // nested host, past 120 s there once when its core was shared).
  const limitMs = bound(60_000);
  const r = spawnSync(process.execPath, nodeArgs('test/fixtures/kick-at-start.ts', '500'), { encoding: 'utf8', timeout: limitMs });
  assert.is(r.signal, null, `the child hung (killed by ${r.signal} after ${limitMs / 1000} s); stderr: ${r.stderr}`);
  assert.is(r.status, 0, r.stderr);
  const out = JSON.parse(r.stdout.trim().split('\n').pop()!) as { cycles: number; ms: number };
  assert.is(out.cycles, 500);
  console.log(`  vmm-lifecycle: 500 paused starts (8 vCPUs) in ${out.ms} ms`);
});

test.run();
