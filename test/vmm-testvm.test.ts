// The VMM with guest/testvm (the project's own PVH test kernel): serial in and
// out, the counter under pause/resume, memory patterns seen by the host, reset
// and triple fault, SMP and the MP table. Skipped (through test/skip-unless.ts) where the
// test guest is not built or /dev/kvm is missing.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Machine } from '../lib/vm/machine.js';
import { bootTestvm, sleep, testvmCommand, testvmImage, testvmSkipReason, until } from './vmm-guests.js';
import { allOrNone } from './all-or-none.js';
import { testUnless } from './skip-unless.js';

const image = testvmImage();
const kvmTest = testUnless('vmm-testvm', testvmSkipReason(), 'kvm');

const STATUS = 0x100000;
const COUNTER = STATUS + 0x08;

function waitExit(m: Machine, timeoutMs = 10_000): Promise<{ state: string; kind: string }> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('no exit event')), timeoutMs);
    m.once('exit', (state, r) => {
      clearTimeout(timer);
      resolve({ state, kind: r.kind });
    });
  });
}

kvmTest('boots to its banner and answers on the serial port', async () => {
  const m = Machine.create({ kernel: image!, vcpus: 1, memoryMiB: 64, cmdline: 'console=ttyS0' });
  const t0 = performance.now();
  await m.start();
  await m.waitForConsole('torpor-testvm ready\n', 10_000);
  const bannerMs = performance.now() - t0;
  const boot = await m.waitForConsole(/boot=ok[^\n]*\n/, 10_000);
  assert.match(boot, /ram_mib=6[34] /);
  assert.match(await testvmCommand(m, 'echo hello   serial world', 'echo'), /^echo=hello serial world$/);
  const info = await testvmCommand(m, 'info', 'info');
  assert.match(info, /cmdline=console=ttyS0/);
  assert.match(info, /memmap=3 /);
  console.log(`  vmm-testvm: start -> banner ${bannerMs.toFixed(1)} ms, ${m.stats().pioExits} PIO exits so far`);
  await m.stop();
});

kvmTest('the counter advances while running and stands still while paused', async () => {
  const m = await bootTestvm({ vcpus: 2 });
  assert.match(await testvmCommand(m, 'count start', 'count'), /running=1/);
  const read = () => m.readGuest(COUNTER, 8).readBigUInt64LE();
  await sleep(100);
  const a = read();
  await until(() => read() > a, 'the counter to advance');
  assert.ok(read() > a, 'counter does not advance');
  await m.pause();
  const p = read();
  await sleep(150);
  assert.is(read(), p, 'counter moved while paused');
  await m.resume();
  await until(() => read() > p, 'the counter to resume');
  assert.ok(read() > p, 'counter did not resume');
  assert.match(await testvmCommand(m, 'count stop', 'count'), /running=0/);
  await m.stop();
});

kvmTest('memory patterns written by the guest are seen through the host accessor', async () => {
  const m = await bootTestvm({ memoryMiB: 128 });
  const tag = 0x5a5a0000;
  const base = 0x2000000;
  const pages = 256;
  assert.match(await testvmCommand(m, `mem 0x${tag.toString(16)} ${pages} 0x${base.toString(16)}`, 'mem'), /^mem=ok .*bad=0/);
  for (let i = 0; i < pages; i++) {
    const addr = base + i * 4096;
    assert.is(m.readGuest(addr, 4).readUInt32LE(), (tag ^ addr) >>> 0, `page ${i}`);
  }
  assert.is(m.readGuest(STATUS, 4).readUInt32LE(), 0x314d5654, 'status page magic');
  await m.stop();
});

kvmTest('reset and triple fault end the machine with their reasons', async () => {
  const a = await bootTestvm();
  const endA = waitExit(a);
  a.consoleWrite('reset\n');
  assert.equal(await endA, { state: 'stopped', kind: 'reset' });
  assert.match(a.exitReason!.consoleTail, /reset=now/);

  const b = await bootTestvm();
  const endB = waitExit(b);
  b.consoleWrite('triple\n');
  assert.equal(await endB, { state: 'failed', kind: 'triple-fault' });
  assert.match(b.exitReason!.consoleTail, /triple=now/);
});

kvmTest('SMP: 2 vCPUs boot, pause and resume; the MP table lists both and wires every GSI', async () => {
  const m = await bootTestvm({ vcpus: 2, rng: true });
  const mp = m.readGuest(0x9fc00, 16);
  assert.is(mp.toString('latin1', 0, 4), '_MP_');
  let sum = 0;
  for (const b of mp) sum = (sum + b) & 0xff;
  assert.is(sum, 0, 'floating pointer checksum');
  const tableAddr = mp.readUInt32LE(4);
  const header = m.readGuest(tableAddr, 44);
  assert.is(header.toString('latin1', 0, 4), 'PCMP');
  const table = m.readGuest(tableAddr, header.readUInt16LE(4));
  sum = 0;
  for (const b of table) sum = (sum + b) & 0xff;
  assert.is(sum, 0, 'table checksum');
  let off = 44;
  const cpus: number[] = [];
  const irqs: number[] = [];
  for (let i = 0; i < header.readUInt16LE(34); i++) {
    const type = table[off]!;
    if (type === 0) {
      cpus.push(table[off + 1]!);
      off += 20;
    } else {
      if (type === 3) irqs.push(table[off + 7]!);
      off += 8;
    }
  }
  assert.equal(cpus, [0, 1]);
  for (let irq = 0; irq < 16; irq++) assert.ok(irqs.includes(irq), `ISA IRQ ${irq}`);
  assert.ok(irqs.includes(5), 'virtio GSI 5');
  for (let i = 0; i < 3; i++) {
    await m.pause();
    await m.resume();
  }
  assert.match(await testvmCommand(m, 'rng 8', 'rng'), /^rng=[0-9a-f]{16} len=8$/);
  assert.match(await testvmCommand(m, 'irq', 'irq'), /gsi5=\d+/);
  await m.stop();
});

kvmTest('8 test guests at once in one process', async () => {
  const ms = await allOrNone(Array.from({ length: 8 }, () => bootTestvm({ memoryMiB: 32 })), (m) => m.stop());
  const answers = await Promise.all(ms.map((m, i) => testvmCommand(m, `echo machine-${i}`, 'echo', 20_000)));
  answers.forEach((a, i) => assert.is(a, `echo=machine-${i}`));
  await Promise.all(ms.map((m) => m.stop()));
});

test.run();
