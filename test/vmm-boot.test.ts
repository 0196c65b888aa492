// The VMM's boot paths and lifecycle with the tiny guests of test/vmm-guests.ts
// (PVH ELF32, ELF64 through the 64-bit boot protocol, bzImage): no test VM build
// needed. Each asserts on what the guest printed or wrote into its memory.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { Machine } from '../lib/vm/machine.js';
import {
  COUNTER_GPA,
  MAGIC_COPY_GPA,
  PVH_BANNER,
  PVH_START_INFO_MAGIC,
  SMP_CODE,
  INT3_LOOP,
  PIO_LOOP,
  TAG_BASE_GPA,
  TAG_PAGES,
  bzImage,
  elf64,
  kvmSkipReason,
  pvhElf32,
  sleep,
  until,
  waitExit,
  writeTemp,
} from './vmm-guests.js';
import { bound } from './bounds.js';
import { testUnless } from './skip-unless.js';

const kvmTest = testUnless('vmm-boot', kvmSkipReason(), 'kvm');

const pvh = writeTemp('pvh.elf', pvhElf32());


async function expectCode(fn: () => unknown, code: string, re?: RegExp) {
  try {
    await fn();
  } catch (err) {
    assert.instance(err, TorporError, String(err));
    assert.is((err as TorporError).code, code, (err as Error).message);
    if (re) assert.match((err as Error).message, re);
    return;
  }
  assert.unreachable(`expected ${code}`);
}

kvmTest('PVH ELF: banner, hvm_start_info in RBX, tagged pages seen through readGuest', async () => {
  const m = Machine.create({ kernel: pvh, cmdline: 'console=ttyS0', vcpus: 1, memoryMiB: 64 });
  assert.is(m.state, 'created');
  await m.start();
  assert.is(m.state, 'running');
  await m.waitForConsole(PVH_BANNER, bound(5000));
  // After the banner the guest tags its pages, then copies the magic: once the magic is there, so are the tags.
  await until(() => m.readGuest(MAGIC_COPY_GPA, 4).readUInt32LE() === PVH_START_INFO_MAGIC, 'the start info magic in guest memory');
  for (let i = 0; i < TAG_PAGES; i++) assert.is(m.readGuest(TAG_BASE_GPA + i * 4096, 4).readUInt32LE(), 0xc0de0000 + i);
  // The start info's command line is what the guest was given.
  const si = m.readGuest(0x6000, 56);
  const cmdlineAddr = Number(si.readBigUInt64LE(24));
  assert.is(m.readGuest(cmdlineAddr, 13).toString(), 'console=ttyS0');
  const st = m.stats();
  assert.ok(st.pioExits >= PVH_BANNER.length, `pio exits ${st.pioExits}`);
  assert.ok(st.createToFirstRunNs > 0);
  const r = await m.stop();
  assert.is(r.kind, 'stop');
  assert.is(m.state, 'stopped');
  assert.match(r.consoleTail, PVH_BANNER);
});

kvmTest('the counter advances while running and stands still while paused', async () => {
  const m = Machine.create({ kernel: pvh, vcpus: 2, memoryMiB: 32 });
  await m.start();
  await m.waitForConsole(PVH_BANNER, bound(5000));
  const counter = () => m.readGuest(COUNTER_GPA, 4).readUInt32LE();
  const a = counter();
  await until(() => counter() > a, `the counter to advance from ${a}`);
  for (let round = 0; round < 3; round++) {
    await m.pause();
    assert.is(m.state, 'paused');
    const p1 = counter();
    await sleep(60);
    assert.is(counter(), p1, 'counter moved while paused');
    await m.resume();
    assert.is(m.state, 'running');
    await until(() => counter() > p1, `the counter to advance after resume from ${p1}`);
  }
  await m.stop();
});

kvmTest('serial input reaches the guest and its echo comes back', async () => {
  const m = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16 });
  const chunks: Buffer[] = [];
  m.on('console', (d) => chunks.push(d));
  await m.start();
  await m.waitForConsole(PVH_BANNER, bound(5000));
  m.consoleWrite('ping');
  await m.waitForConsole(`${PVH_BANNER}\nping`, bound(5000));
  assert.is(Buffer.concat(chunks).toString(), `${PVH_BANNER}\nping`);
  assert.is(m.consoleTail().toString(), `${PVH_BANNER}\nping`);
  await m.stop();
});

kvmTest('serial input beyond the UART FIFO (4 KiB) is fed in order as the guest drains it', async () => {
  const m = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16 });
  await m.start();
  await m.waitForConsole(PVH_BANNER, bound(5000));
  const alphabet = 'abcdefghijklmnopqsuvwxyz'; // no 'r' (reset) nor 't' (triple fault)
  const input = Array.from({ length: 10_000 }, (_, i) => alphabet[i % alphabet.length]).join('');
  m.consoleWrite(input);
  // The echo guest runs emulated on PVM and, in the nested host, under an emulated L1 too:
  // 30 s once did not suffice there for the whole echo.
  await m.waitForConsole(`${PVH_BANNER}\n${input}`, bound(30_000));
  await m.stop();
});

kvmTest('i8042 reset stops the machine with reason reset', async () => {
  const m = Machine.create({ kernel: pvh, vcpus: 2, memoryMiB: 16 });
  await m.start();
  await m.waitForConsole(PVH_BANNER, bound(5000));
  const ended = waitExit(m);
  m.consoleWrite('r');
  const e = await ended;
  assert.is(e.state, 'stopped');
  assert.is(e.kind, 'reset');
  assert.is(m.state, 'stopped');
  assert.is(m.exitReason?.kind, 'reset');
  assert.match(m.exitReason?.consoleTail ?? '', PVH_BANNER);
  await expectCode(() => m.pause(), 'INVALID_STATE');
  assert.is((await m.stop()).kind, 'reset', 'stop after the end keeps the reason');
});

kvmTest('a triple fault fails the machine; the process goes on and boots the next one', async () => {
  const m = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16 });
  await m.start();
  await m.waitForConsole(PVH_BANNER, bound(5000));
  const ended = waitExit(m);
  m.consoleWrite('t');
  const e = await ended;
  assert.is(e.state, 'failed');
  assert.is(e.kind, 'triple-fault');
  assert.is(m.state, 'failed');
  const next = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16 });
  await next.start();
  await next.waitForConsole(PVH_BANNER, bound(5000));
  await next.stop();
});

kvmTest('ELF64 without a PVH note boots through the 64-bit boot protocol (RSI -> boot_params)', async () => {
  const m = Machine.create({ kernel: writeTemp('l64.elf', elf64()), cmdline: 'quiet', vcpus: 1, memoryMiB: 64 });
  const ended = waitExit(m);
  await m.start();
  const e = await ended;
  assert.is(e.kind, 'reset');
  assert.is(m.exitReason?.consoleTail, 'L64+\n');
});

kvmTest('bzImage (protocol 2.15, XLF_KERNEL_64) is entered at load address + 0x200', async () => {
  const m = Machine.create({ kernel: writeTemp('bz', bzImage()), cmdline: 'quiet', vcpus: 1, memoryMiB: 64 });
  const ended = waitExit(m);
  await m.start();
  const e = await ended;
  assert.is(e.kind, 'reset');
  assert.is(m.exitReason?.consoleTail, 'L64+\n');
  // The zero page carries the command line and the e820 map.
  const zp = m.readGuest(0x7000, 4096);
  assert.is(zp.readUInt16LE(0x1fe), 0xaa55);
  assert.is(zp[0x210], 0xff, 'type_of_loader');
  assert.is(m.readGuest(zp.readUInt32LE(0x228), 5).toString(), 'quiet');
  assert.is(zp[0x1e8], 3, 'e820 entries below 3 GiB');
  assert.is(Number(zp.readBigUInt64LE(0x2d0 + 2 * 20 + 8)), 64 * 1024 * 1024 - 0x100000);
});

kvmTest('untrusted kernels are refused with BOOT_FAILED, not loaded', async () => {
  const bad: Array<[string, Buffer, RegExp]> = [
    ['garbage', Buffer.alloc(4096, 0x41), /not an ELF kernel and not a bzImage/],
    ['truncated ELF', pvhElf32().subarray(0, 60), /truncated|outside the file/],
    ['old bzImage', bzImage(undefined, { version: 0x020b }), /older than 2\.12/],
    ['32-bit-only bzImage', bzImage(undefined, { xloadflags: 0 }), /XLF_KERNEL_64/],
  ];
  // An ELF whose segment claims more memory than the guest has.
  const huge = pvhElf32();
  huge.writeUInt32LE(0x7fffffff, 52 + 20);
  bad.push(['oversized segment', huge, /does not fit in guest RAM/]);
  // A segment whose file range runs past the end of the file.
  const past = pvhElf32();
  past.writeUInt32LE(0xfffffff0, 52 + 4);
  bad.push(['segment offset past EOF', past, /outside the file/]);
  for (const [name, bytes, re] of bad) {
    await expectCode(() => Machine.create({ kernel: writeTemp('bad', bytes), vcpus: 1, memoryMiB: 16 }), 'BOOT_FAILED', re);
    void name;
  }
  await expectCode(() => Machine.create({ kernel: '/nonexistent/vmlinux', vcpus: 1, memoryMiB: 16 }), 'BOOT_FAILED');
});

kvmTest('options are validated (INVALID_ARGUMENT) and lifecycle misuse is INVALID_STATE', async () => {
  await expectCode(() => Machine.create({ kernel: pvh, vcpus: 0 }), 'INVALID_ARGUMENT');
  await expectCode(() => Machine.create({ kernel: pvh, memoryMiB: 1.5 }), 'INVALID_ARGUMENT');
  await expectCode(() => Machine.create({ kernel: '' }), 'INVALID_ARGUMENT');
  await expectCode(() => Machine.create({ kernel: pvh, kvmDevice: '/nonexistent/kvm' }), 'KVM_UNAVAILABLE');
  const m = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16 });
  await expectCode(() => m.pause(), 'INVALID_STATE');
  await expectCode(() => m.resume(), 'INVALID_STATE');
  await expectCode(() => m.readGuest(16 * 1024 * 1024 - 2, 4), 'GUEST_MEMORY');
  await expectCode(() => m.readGuest(0xd0000000, 4), 'GUEST_MEMORY');
  assert.is(m.readGuest(0, 4).length, 4);
  const r = await m.stop();
  assert.is(r.kind, 'stop');
  assert.is(m.state, 'stopped');
  await expectCode(() => m.start(), 'INVALID_STATE');
  assert.is((await m.stop()).kind, 'stop', 'stop is idempotent');
});

kvmTest('RAM beyond 3 GiB is placed above the MMIO hole', async () => {
  const m = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 3 * 1024 + 64 });
  assert.is(m.readGuest(0xc0000000 - 4, 4).length, 4);
  await expectCode(() => m.readGuest(0xc0000000, 4), 'GUEST_MEMORY');
  assert.is(m.readGuest(0x100000000 + 64 * 1024 * 1024 - 4, 4).length, 4);
  await expectCode(() => m.readGuest(0x100000000 + 64 * 1024 * 1024, 4), 'GUEST_MEMORY');
  await m.stop();
});

kvmTest('SMP: the guest starts vCPU 1 with INIT/SIPI through the in-kernel LAPIC and both run', async () => {
  const m = Machine.create({ kernel: writeTemp('smp.elf', pvhElf32(SMP_CODE)), vcpus: 2, memoryMiB: 16 });
  await m.start();
  await m.waitForConsole(/BA|AB/, 5000);
  await m.pause();
  await m.resume();
  assert.is(m.state, 'running');
  await m.stop();
});

kvmTest('200 pause/resume cycles with PIO exits in flight on 2 vCPUs, then stop during a pause', async () => {
  const m = Machine.create({ kernel: writeTemp('pio.elf', pvhElf32(PIO_LOOP)), vcpus: 2, memoryMiB: 16 });
  await m.start();
  let last = 0;
  for (let i = 0; i < 200; i++) {
    await m.pause();
    const exits = m.stats().pioExits;
    assert.ok(exits >= last, 'exit counter went backwards');
    await m.resume();
    last = exits;
  }
  // The guest still runs after the cycles (how many exits fit between two cycles is timing,
  // so wait for progress instead of counting on a number).
  await until(() => m.stats().pioExits >= last + 1000, `1000 more PIO exits after the cycles`, 5000);
  const pausing = m.pause();
  const reason = await m.stop();
  assert.is(reason.kind, 'stop');
  await pausing.then(
    () => undefined,
    (err: TorporError) => assert.is(err.code, 'INVALID_STATE'),
  );
  assert.is(m.state, 'stopped');
});

kvmTest('an instruction the guest cannot run fails the machine with the reason (emulation failure or triple fault)', async () => {
  const m = Machine.create({ kernel: writeTemp('int3.elf', pvhElf32(INT3_LOOP)), vcpus: 1, memoryMiB: 16 });
  const ended = waitExit(m);
  await m.start();
  const e = await ended;
  assert.is(e.state, 'failed');
  assert.ok(['emulation-failure', 'triple-fault'].includes(e.kind), e.kind);
  assert.ok(e.message.length > 10, e.message);
  const again = Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16 });
  await again.start();
  await again.waitForConsole(PVH_BANNER, bound(5000));
  await again.stop();
});

kvmTest('8 machines at once in one process', async () => {
  const ms = Array.from({ length: 8 }, () => Machine.create({ kernel: pvh, vcpus: 1, memoryMiB: 16 }));
  try {
    await Promise.all(ms.map((m) => m.start()));
    await Promise.all(ms.map((m) => m.waitForConsole(PVH_BANNER, bound(10_000))));
    // Every guest counts: its counter moves only while it polls an empty UART, so each must
    // be seen counting before any input reaches it. After its banner a guest still tags 64
    // pages before its loop, which takes a while where page faults are slow (the nested
    // host: each is a nested fault, emulated), and input that arrives before the first poll
    // is echoed with the counter still at 0.
    const counter = (m: Machine) => m.readGuest(COUNTER_GPA, 4).readUInt32LE();
    await until(() => ms.every((m) => counter(m) > 0), 'every guest to count', 10_000).catch(() =>
      assert.unreachable(`not every guest counted: counters ${ms.map(counter)}`),
    );
    const before = ms.map(counter);
    ms.forEach((m, i) => m.consoleWrite(String.fromCharCode(0x61 + i)));
    await Promise.all(ms.map((m, i) => m.waitForConsole(`${PVH_BANNER}\n${String.fromCharCode(0x61 + i)}`, bound(10_000))));
    await Promise.all(ms.map((m) => m.pause()));
    const after = ms.map(counter);
    assert.ok(after.every((c, i) => c >= before[i]!), `counters went back: ${before} -> ${after}`);
    const reasons = await Promise.all(ms.map((m) => m.stop()));
    assert.ok(reasons.every((r) => r.kind === 'stop'));
  } finally {
    await Promise.all(ms.map((m) => m.stop()));
  }
});

test.run();
