// Machine snapshots with guest/testvm: pause quiescing the devices, capture
// and restore (in this process and in a child Node process), memory diff
// layers, corrupt snapshots refused before any guest runs.
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import * as assert from 'uvu/assert';
import { test } from 'uvu';

import { Machine } from '../lib/vm/machine.js';
import { bootTestvm, sleep, testvmCommand, testvmSkipReason } from './vmm-guests.js';
import { testUnless } from './skip-unless.js';

const kvmTest = testUnless('vmm-snapshot', testvmSkipReason());

const COUNTER = 0x100008;
const MiB = 1024 * 1024;

function tempDir(): string {
  return mkdtempSync(join(tmpdir(), 'torpor-snap-'));
}

function hashRam(m: Machine, bytes: number): string {
  const h = createHash('sha256');
  for (let off = 0; off < bytes; off += 16 * MiB) h.update(m.readGuest(off, Math.min(16 * MiB, bytes - off)));
  return h.digest('hex');
}

async function until(cond: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

function child(...args: string[]): string {
  const r = spawnSync(process.execPath, ['--import', 'tsx', 'test/fixtures/snapshot-child.ts', ...args], {
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

test.run();
