// Sandbox.create: options are validated before anything starts, whatever the host (a supplied
// kernel that is no regular file is an option error too); then a host that cannot boot a Linux
// guest gets KVM_UNAVAILABLE saying why (runs on every host, no VM needed).
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { TorporError } from '../lib/errors.js';

const code = (c: string) => (e: unknown) => e instanceof TorporError && e.code === c;

test('invalid options are INVALID_ARGUMENT before anything starts', async () => {
  const home = await mkdtemp(join(tmpdir(), 'torpor-home-'));
  const saved = process.env.TORPOR_HOME;
  process.env.TORPOR_HOME = home;
  try {
    const bad: unknown[] = [
      { vcpus: 0 },
      { vcpus: 1.5 },
      { memoryMiB: 1 },
      { envs: { A: 1 } },
      { metadata: 'x' },
      { boot: { timeoutMs: -5 } },
      { boot: { kernel: '/nonexistent/vmlinux' } },
      { timeoutMs: 0 },
      { bogus: true },
      { template: true },
      { template: '' },
      42,
      { vcpus: '2' },
      { cpuCount: 2, vcpus: 3 },
      { memoryMB: 'lots' },
      { envs: 'A=1' },
      { timeoutMs: 1000, lifecycle: { onTimeout: 'explode' } },
      { network: { ports: [0] } },
      { network: 'on' },
      { boot: { cmdlineExtra: 5 } },
      { template: 7 },
    ];
    for (const opts of bad) {
      const err = await Sandbox.create(opts as never).catch((e) => e);
      assert.ok(code('INVALID_ARGUMENT')(err), `${JSON.stringify(opts)} -> ${err}`);
    }
    assert.ok(code('TEMPLATE_NOT_FOUND')(await Sandbox.create({ template: 'nope' }).catch((e) => e)));
    // E2B's form: the template first.
    assert.ok(code('TEMPLATE_NOT_FOUND')(await Sandbox.create('nope', { timeoutMs: 1000 }).catch((e) => e)));
    assert.ok(code('INVALID_ARGUMENT')(await Sandbox.create('nope', { template: 'other' }).catch((e) => e)));
    assert.equal(await readdir(home), [], 'nothing was created');
    // A directory as the kernel: there, but not a kernel. Refused before the host is looked at,
    // so on every host, with or without /dev/kvm.
    assert.ok(code('KERNEL_INVALID')(await Sandbox.create({ boot: { kernel: tmpdir() } }).catch((e) => e)));
  } finally {
    if (saved === undefined) delete process.env.TORPOR_HOME;
    else process.env.TORPOR_HOME = saved;
    await rm(home, { recursive: true, force: true });
  }
});

test('a supplied kernel that is no kernel: KVM_UNAVAILABLE where no Linux boots (saying why), else KERNEL_INVALID; no sandbox directory left', async () => {
  const home = await mkdtemp(join(tmpdir(), 'torpor-home-'));
  const saved = process.env.TORPOR_HOME;
  process.env.TORPOR_HOME = home;
  try {
    const junk = join(home, 'not-a-kernel');
    await writeFile(junk, 'MZ this is not a kernel\n');
    const err = await Sandbox.create({ boot: { kernel: junk } }).catch((e) => e);
    // A regular file passes the option checks; then the host is asked. Where no Linux guest boots
    // (no /dev/kvm, a PVM host) that refuses with KVM_UNAVAILABLE, saying why and what to do;
    // where one does, the kernel's contents are read and refused.
    const support = await linuxGuestSupport(junk);
    if (support.ok) {
      assert.ok(code('KERNEL_INVALID')(err), String(err));
    } else {
      assert.ok(code('KVM_UNAVAILABLE')(err), String(err));
      assert.ok((err as Error).message.includes(support.reason));
      assert.match((err as Error).message, /TORPOR_KERNEL|\/dev\/kvm/);
    }
    const sandboxes = await readdir(join(home, 'sandboxes')).catch(() => []);
    assert.equal(sandboxes, [], 'no sandbox directory left behind');
  } finally {
    if (saved === undefined) delete process.env.TORPOR_HOME;
    else process.env.TORPOR_HOME = saved;
    await rm(home, { recursive: true, force: true });
  }
});

test.run();
