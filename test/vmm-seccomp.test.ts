// Per-thread seccomp (docs/seccomp.md): every vCPU thread and the I/O thread
// run under their allow-list; a call outside it fails that machine with kind
// 'seccomp-violation' while the process and the other machines go on.
// The forbidden call is made through the test hook the addon has when
// TORPOR_SECCOMP_TEST_HOOK is set (read when a machine is built): a guest
// write of 1 to port 0x5ec makes the vCPU thread call uname(2), 2 makes the
// I/O thread call it.
import { readdirSync, readFileSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { Machine } from '../lib/vm/machine.js';
import { PVH_BANNER, kvmSkipReason, pvhElf32, until, waitExit, writeTemp } from './vmm-guests.js';
import { testUnless } from './skip-unless.js';

const kvmTest = testUnless('vmm-seccomp', kvmSkipReason(), 'kvm');

process.env.TORPOR_SECCOMP_TEST_HOOK = '1';

const pvh = writeTemp('pvh.elf', pvhElf32());

/*
 * mov dx, 0x5ec ; mov al, <value> ; out dx, al ; then spins: jmp $
 */
function forbiddenCallGuest(value: 1 | 2): string {
  const code = Buffer.from([0x66, 0xba, 0xec, 0x05, 0xb0, value, 0xee, 0xeb, 0xfe]);
  return writeTemp(`seccomp-${value}.elf`, pvhElf32(code));
}


/** The Seccomp field of /proc/self/task/<tid>/status for each thread with this name prefix. */
function seccompModes(prefix: string): number[] {
  const modes: number[] = [];
  for (const tid of readdirSync('/proc/self/task')) {
    try {
      const comm = readFileSync(`/proc/self/task/${tid}/comm`, 'utf8').trim();
      if (!comm.startsWith(prefix)) continue;
      const status = readFileSync(`/proc/self/task/${tid}/status`, 'utf8');
      modes.push(Number(/^Seccomp:\s+(\d+)/m.exec(status)?.[1] ?? -1));
    } catch {
      // the thread ended while we read
    }
  }
  return modes;
}

kvmTest('every vCPU thread and the I/O thread run in seccomp filter mode; the JS thread does not', async () => {
  const m = Machine.create({ kernel: pvh, vcpus: 2, memoryMiB: 16 });
  try {
    await m.start();
    await m.waitForConsole(PVH_BANNER, 5000);
    // The I/O thread names itself when it first runs, which on a loaded host can come after the
    // guest's banner (printed by a vCPU thread): give it a moment.
    await until(() => seccompModes('torpor-io').length > 0, 'the I/O thread to name itself', 5000);
    const vcpus = seccompModes('torpor-vcpu');
    const io = seccompModes('torpor-io');
    assert.ok(vcpus.length >= 2, `vCPU threads found: ${vcpus.length}`);
    assert.ok(io.length >= 1, `I/O threads found: ${io.length}`);
    for (const mode of [...vcpus, ...io]) assert.is(mode, 2, 'SECCOMP_MODE_FILTER');
    const self = readFileSync('/proc/thread-self/status', 'utf8');
    assert.match(self, /^Seccomp:\s+0$/m);
  } finally {
    await m.stop();
  }
});

for (const [value, where, re] of [
  [1, 'a vCPU thread', /vCPU 0 thread made system call \d+ \(uname\)/],
  [2, 'the I/O thread', /the I\/O thread made system call \d+ \(uname\)/],
] as const) {
  kvmTest(`a forbidden call on ${where} fails that machine (seccomp-violation); the process and another machine go on`, async () => {
    const bystander = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16 });
    await bystander.start();
    await bystander.waitForConsole(PVH_BANNER, 5000);

    const m = Machine.create({ kernel: forbiddenCallGuest(value), vcpus: 1, memoryMiB: 16 });
    const ended = waitExit(m);
    await m.start();
    const e = await ended;
    assert.is(e.state, 'failed');
    assert.is(e.kind, 'seccomp-violation');
    assert.match(e.message, re);
    assert.is(m.state, 'failed');
    try {
      await m.pause();
      assert.unreachable('pause of a failed machine');
    } catch (err) {
      assert.instance(err, TorporError);
      assert.is((err as TorporError).code, 'INVALID_STATE');
    }
    await m.stop();

    // The other machine still answers on its console (the fixture echoes all but 'r' and 't').
    bystander.consoleWrite('alive');
    await bystander.waitForConsole(`${PVH_BANNER}\nalive`, 5000);
    await bystander.stop();
  });
}

// signal-exit (loaded by many npm packages; verdaccio's lockfile in template-linux) listens
// to SIGSYS: libuv then installs its own SIGSYS handler, and SIG_DFL once the listener goes.
// A trap after that killed the whole test process in CI; the addon now takes SIGSYS back.
kvmTest('a Node listener for SIGSYS, added and removed, does not turn a trap into the death of the process', async () => {
  let heard = 0;
  const listener = (): void => {
    heard++;
  };
  process.on('SIGSYS', listener);
  // A SIGSYS from outside (not a trap) reaches the JS listener, as it did before any machine.
  process.kill(process.pid, 'SIGSYS');
  await until(() => heard > 0, 'the listener to hear SIGSYS');
  await new Promise((r) => setTimeout(r, 50)); // and only once
  assert.is(heard, 1);
  const first = Machine.create({ kernel: forbiddenCallGuest(1), vcpus: 1, memoryMiB: 16 });
  const firstEnded = waitExit(first);
  await first.start();
  const e1 = await firstEnded;
  assert.is(e1.kind, 'seccomp-violation');
  await first.stop();
  process.kill(process.pid, 'SIGSYS');
  await until(() => heard > 1, 'the listener to hear SIGSYS again');
  await new Promise((r) => setTimeout(r, 50)); // and only once more
  assert.is(heard, 2, 'the listener still hears a SIGSYS that is not a trap');
  process.off('SIGSYS', listener); // libuv: SIG_DFL

  const second = Machine.create({ kernel: forbiddenCallGuest(2), vcpus: 1, memoryMiB: 16 });
  const secondEnded = waitExit(second);
  await second.start();
  const e2 = await secondEnded;
  assert.is(e2.kind, 'seccomp-violation');
  assert.match(e2.message, /the I\/O thread made system call \d+ \(uname\)/);
  await second.stop();
});

test.run();
