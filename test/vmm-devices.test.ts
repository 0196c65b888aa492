// virtio devices through a real VM (guest/testvm drives them): virtio-blk
// writes land in the overlay and never in the base image, virtio-rng
// answers, virtio-vsock echoes with flow control, survives a transport reset
// and refuses unknown ports.
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { Machine } from '../lib/vm/machine.js';
import { bootTestvm, sleep, testvmCommand, testvmImage, testvmSkipReason, until } from './vmm-guests.js';
import { bound } from './bounds.js';
import { testUnless } from './skip-unless.js';

const kvmTest = testUnless('vmm-devices', testvmSkipReason(), 'kvm');

function fnv1a(bytes: Buffer): number {
  let h = 0x811c9dc5;
  for (const b of bytes) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return h >>> 0;
}

const sha = (p: string) => createHash('sha256').update(readFileSync(p)).digest('hex');

kvmTest('virtio-blk: reads see the base, writes land in the overlay only, and persist in it', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-blk-'));
  const base = join(dir, 'base.img');
  const overlay = join(dir, 'overlay.data');
  const baseBytes = randomBytes(1 << 20);
  writeFileSync(base, baseBytes);
  const baseHash = sha(base);

  await using m = await bootTestvm({ disks: [{ base, overlay, serial: 'torpor-disk0' }] });
  assert.match(await testvmCommand(m, 'blk', 'blk'), /^blk=ok capacity=2048 read_only=0/);
  const read = await testvmCommand(m, 'blk-read 3 2', 'blk-read');
  const expected = baseBytes.subarray(3 * 512, 5 * 512);
  assert.match(read, new RegExp(`fnv=0x0*${fnv1a(expected).toString(16)} `));
  assert.match(read, new RegExp(`head=${expected.subarray(0, 16).toString('hex')}`));
  assert.match(await testvmCommand(m, 'blk-write 16 0x1234abcd 4', 'blk-write'), /^blk-write=ok/);
  assert.match(await testvmCommand(m, 'blk-verify 16 0x1234abcd 4', 'blk-verify'), /^blk-verify=ok/);
  assert.match(await testvmCommand(m, 'blk-flush', 'blk-flush'), /^blk-flush=ok/);
  assert.is(await testvmCommand(m, 'blk-id', 'blk-id'), 'blk-id=torpor-disk0');
  await m.stop();

  assert.is(sha(base), baseHash, 'the base image was written to');
  assert.ok(existsSync(overlay) && statSync(overlay).size > 0, 'the overlay holds nothing');

  // A new machine over the same base and overlay sees the written sectors.
  await using again = await bootTestvm({ disks: [{ base, overlay }] });
  assert.match(await testvmCommand(again, 'blk-verify 16 0x1234abcd 4', 'blk-verify'), /^blk-verify=ok/);
  const untouched = await testvmCommand(again, 'blk-read 3 1', 'blk-read');
  assert.match(untouched, new RegExp(`fnv=0x0*${fnv1a(baseBytes.subarray(3 * 512, 4 * 512)).toString(16)} `));
  await again.stop();
});

kvmTest('virtio-rng: the guest reads host randomness', async () => {
  await using m = await bootTestvm({ rng: true });
  const a = await testvmCommand(m, 'rng 32', 'rng');
  const b = await testvmCommand(m, 'rng 32', 'rng');
  assert.match(a, /^rng=[0-9a-f]{64} len=32$/);
  assert.is.not(a, b);
});

function readExactly(sock: net.Socket, n: number, timeoutMs = 20_000): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let got = 0;
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`read ${got}/${n} bytes before the timeout`));
    }, timeoutMs);
    const onData = (d: Buffer) => {
      chunks.push(d);
      got += d.length;
      if (got >= n) {
        cleanup();
        const all = Buffer.concat(chunks);
        if (all.length > n) sock.unshift(all.subarray(n));
        resolve(all.subarray(0, n));
      }
    };
    const onEnd = () => {
      cleanup();
      reject(new Error(`connection ended after ${got}/${n} bytes`));
    };
    const cleanup = () => {
      clearTimeout(timer);
      sock.off('data', onData);
      sock.off('end', onEnd);
    };
    sock.on('data', onData);
    sock.on('end', onEnd);
  });
}

kvmTest('virtio-vsock: echo, 1000 round trips, 4 MiB with flow control, reset and reconnect, RST for unknown ports', async () => {
  // A failed step must not leak the machine or its sockets: either would keep Node alive after the run.
  const m = await bootTestvm({ vsockCid: 3 });
  const sockets: net.Socket[] = [];
  try {
    const s = await m.vsockConnect(7);
    sockets.push(s);
    s.write('hello vsock');
    assert.is((await readExactly(s, 11)).toString(), 'hello vsock');

    const t0 = performance.now();
    for (let i = 0; i < 1000; i++) {
      const msg = Buffer.from(`ping-${i}`);
      s.write(msg);
      assert.is((await readExactly(s, msg.length)).toString(), msg.toString());
    }
    const rtUs = ((performance.now() - t0) * 1000) / 1000;

    const big = randomBytes(4 << 20);
    const t1 = performance.now();
    const back = readExactly(s, big.length, 120_000);
    s.write(big);
    const echoed = await back;
    const mibs = 4 / ((performance.now() - t1) / 1000);
    assert.ok(echoed.equals(big), '4 MiB echo differs');
    console.log(`  vmm-devices: vsock echo round trip ${rtUs.toFixed(0)} us, 4 MiB echoed at ${mibs.toFixed(1)} MiB/s`);

    const closed = new Promise<void>((resolve) => s.once('close', () => resolve()));
    s.on('error', () => undefined);
    m.vsockReset();
    await closed;
    // The guest re-posts its event buffer after the reset; connect until it listens again
    // (later, not never, on a host that starves the guest).
    let s2: net.Socket | undefined;
    const deadline = Date.now() + bound(10_000);
    while (!s2 && Date.now() < deadline) {
      try {
        s2 = await m.vsockConnect(7, 2000);
        sockets.push(s2);
      } catch {
        await sleep(20);
      }
    }
    assert.ok(s2, 'no reconnect after the transport reset');
    s2!.write('after reset');
    assert.is((await readExactly(s2!, 11)).toString(), 'after reset');
    s2!.destroy();

    try {
      await m.vsockConnect(9, 2000);
      assert.unreachable('connected to a port nobody listens on');
    } catch (err) {
      assert.instance(err, TorporError);
      assert.is((err as TorporError).code, 'VSOCK_REFUSED');
    }
    s.destroy();
    assert.match(await testvmCommand(m, 'vsock', 'vsock'), /transport_resets=1/);
  } finally {
    for (const sock of sockets) sock.destroy();
    await m.stop();
  }
});

kvmTest("virtio-vsock knock: the guest's REQUEST to a knock port is an event and a latched count; a burst is counted, not queued", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-knock-'));
  const events: Array<[number, number]> = [];
  // testvm.agent_ready=1: the guest knocks on port 1023 once its vsock responder listens, as the agent does.
  const m = Machine.create({ kernel: testvmImage()!, vcpus: 1, memoryMiB: 64, vsockCid: 3, vsockKnockPorts: [1023, 1000], cmdline: 'testvm.agent_ready=1' });
  m.on('vsockKnock', (port, count) => events.push([port, count]));
  try {
    await m.start();
    await m.waitForConsole(/torpor-agent ready v1 /, 10_000);
    await until(() => m.vsockKnocks(1023) > 0, 'the knock at boot');
    assert.is(m.vsockKnocks(1023), 1, 'one knock at boot');
    assert.is(m.vsockKnocks(1000), 0, 'nothing on the other knock port');
    assert.is(m.vsockKnocks(1022), 0, 'not a knock port');
    await until(() => events.length > 0, 'the knock event');
    assert.equal(events, [[1023, 1]]);

    // The guest knocks in a loop: every knock counted, the reports coalesced, the driver still fine.
    assert.match(await testvmCommand(m, 'knock 500', 'knock', 60_000), /^knock=ok count=500/);
    await until(() => m.vsockKnocks(1023) >= 501, 'the count of 501 knocks');
    assert.is(m.vsockKnocks(1023), 501);
    await until(() => events.at(-1)![1] >= 501, 'the event with the final count');
    assert.equal(events.at(-1), [1023, 501], 'the last event carries the final count');
    assert.ok(events.length <= 501, `${events.length} events for 501 knocks`);
    console.log(`  vmm-devices: 500 knocks in a row -> ${events.length - 1} events`);
    assert.match(await testvmCommand(m, 'vsock', 'vsock'), / knocks=501 /);
    const s = await m.vsockConnect(7);
    s.write('after knocks');
    assert.is((await readExactly(s, 12)).toString(), 'after knocks');
    s.destroy();

    // A snapshot keeps no knock ports or counts; Machine.restore takes them again.
    await m.snapshot(dir, { stop: true });
    const r = await Machine.restore(dir, { vsockKnockPorts: [1023] });
    try {
      assert.is(r.vsockKnocks(1023), 0);
      const rEvents: number[] = [];
      r.on('vsockKnock', (_port, count) => rEvents.push(count));
      assert.match(await testvmCommand(r, 'knock 1', 'knock'), /^knock=ok count=1/);
      await until(() => rEvents.length > 0, 'the knock event after the restore');
      assert.equal(rEvents, [1]);
    } finally {
      await r.stop();
    }
  } finally {
    await m.stop();
    rmSync(dir, { recursive: true, force: true });
  }
  // Bad knock ports are refused before any VM is built.
  for (const bad of [[1024], [0], [1.5], Array.from({ length: 17 }, (_, i) => i + 1)]) {
    const err = (() => {
      try {
        Machine.create({ kernel: testvmImage()!, vcpus: 1, memoryMiB: 16, vsockCid: 3, vsockKnockPorts: bad });
      } catch (e) {
        return e;
      }
    })();
    assert.ok(err instanceof TorporError && err.code === 'INVALID_ARGUMENT', `${JSON.stringify(bad)}: ${String(err)}`);
  }
  const noVsock = (() => {
    try {
      Machine.create({ kernel: testvmImage()!, vcpus: 1, memoryMiB: 16, vsockKnockPorts: [1023] });
    } catch (e) {
      return e;
    }
  })();
  assert.ok(noVsock instanceof TorporError && noVsock.code === 'INVALID_ARGUMENT', String(noVsock));
});

test.run();
