// Sandbox.create's whole VM path for real, with the test guest standing in for Linux: this host
// (PVM) cannot boot a Linux guest, but guest/testvm runs here and, with testvm.agent_ready=1,
// knocks on the host's vsock port 1023 as the agent does and answers HELLO/PING on vsock port 1024. What runs is the
// production code: ensureArtifacts (the stored root filesystem becomes virtio-blk disk 0), the
// directory under TORPOR_HOME/sandboxes/<id>/, the Machine, the wait for the knock, vsock, HELLO.
//
// TORPOR_HOME is a fresh directory whose artifacts/ links to the real store: the store is reused
// (building the Debian image takes minutes and root), the sandboxes/ directory is this test's own.
import { existsSync, readdirSync, readlinkSync, statSync } from 'node:fs';
import { copyFile, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import type { AgentClient } from '../lib/agent/client.js';
import { TorporError } from '../lib/errors.js';
import { Sandbox, GUEST_CMDLINE } from '../lib/sandbox/sandbox.js';
import { homeLayout } from '../lib/store/home.js';
import type { Machine } from '../lib/vm/machine.js';
import { allOrNone } from './all-or-none.js';
import { bound } from './bounds.js';
import { privateHome, testvmSandboxTest } from './sandbox-home.js';
import { sleep, testvmImage } from './vmm-guests.js';

const kvmTest = await testvmSandboxTest('sandbox-testvm');
const kernel = testvmImage()!;
const ROOTFS_SECTOR = 512;

/** The sandbox's own agent connection and machine (Sandbox exposes neither: no ping, no hello). */
const internals = (sbx: Sandbox) => sbx as unknown as { client: AgentClient; machine: Machine; dir: string };

/** VM file descriptors this process holds: one per machine not yet torn down. */
function liveVms(): number {
  let n = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${fd}`) === 'anon_inode:kvm-vm') n++;
    } catch {
      // closed while we looked (the readdir fd itself)
    }
  }
  return n;
}

/** liveVms() once it equals n, or what it is after 5 s: a stopped machine's KVM objects are
 *  closed on the addon's reaper thread (native/vmm/reaper.h), shortly after stop() resolved. */
async function settledVms(n: number): Promise<number> {
  for (let i = 0; i < 100 && liveVms() !== n; i++) await sleep(50);
  return liveVms();
}

/** liveVms() once the reaper has finished closing machines stopped before this file ran (a
 *  previous test file's, in a one-process run): the count no longer falls for 500 ms. Machines
 *  still running elsewhere in the process stay in the baseline; every check here is relative to it. */
async function settledBaseline(): Promise<number> {
  let last = liveVms();
  for (let steady = 0, i = 0; steady < 10 && i < 200; i++) {
    await sleep(50);
    const now = liveVms();
    steady = now === last ? steady + 1 : 0;
    last = now;
  }
  return last;
}

// Booted (template: false): these tests are about the boot path, its knock and the VMs it
// leaves (a restore keeps VM shells ready); sandbox-template.test.ts covers templates.
const bootOpts = (extra?: string, timeoutMs = bound(15_000)) => ({
  template: false as const,
  vcpus: 1,
  memoryMiB: 64,
  boot: { kernel, timeoutMs, ...(extra !== undefined ? { cmdlineExtra: extra } : {}) },
});
const AGENT_READY = 'testvm.agent_ready=1';

const home = privateHome(test, 'torpor-sbx-testvm-');
let vmsBefore = 0;

test.before(async () => {
  vmsBefore = await settledBaseline();
});

const sandboxDirs = async () => (await readdir(join(home, 'sandboxes')).catch(() => [] as string[])).sort();

kvmTest('create -> knock on vsock 1023 -> vsock 1024 -> HELLO, with the directory, the disk and vsock as documented', async () => {
  const t0 = performance.now();
  const sbx = await Sandbox.create({ ...bootOpts(AGENT_READY), metadata: { suite: 'sandbox-testvm' }, envs: { A: '1' } });
  const createMs = performance.now() - t0;
  try {
    assert.match(sbx.id, /^sbx_[0-9a-f]{16}$/);
    const dir = join(home, 'sandboxes', sbx.id);
    assert.is(internals(sbx).dir, dir);
    assert.equal(await sandboxDirs(), [sbx.id]);
    assert.equal((await readdir(dir)).sort(), ['console.log', 'meta.json', 'overlay', 'overlay.map', 'owner.lock']);

    const meta = JSON.parse(await readFile(join(dir, 'meta.json'), 'utf8'));
    assert.is(meta.id, sbx.id);
    assert.is(meta.template, 'base');
    assert.is(meta.state, 'running');
    assert.is(meta.vcpus, 1);
    assert.is(meta.memoryMiB, 64);
    assert.equal(meta.metadata, { suite: 'sandbox-testvm' });
    assert.equal(meta.envs, { A: '1' });
    assert.is(meta.ownerPid, process.pid);
    assert.ok(!Number.isNaN(Date.parse(meta.createdAt)));
    // The supplied kernel is the test guest, copied into the store; the disk is the stored rootfs.
    assert.ok(meta.kernel.startsWith(join(home, 'artifacts', 'kernel-supplied')), meta.kernel);
    assert.equal(await readFile(meta.kernel), await readFile(kernel));
    assert.ok(meta.rootfs.startsWith(join(home, 'artifacts', 'rootfs')) && meta.rootfs.endsWith('.ext4'), meta.rootfs);
    // ensureArtifacts with a kernel does not remember it (only `torpor setup --kernel` does).
    assert.not.ok(existsSync(homeLayout(home).setupRecord), 'setup.json was not written');

    // HELLO came from the guest, and the connection is live.
    const { client, machine } = internals(sbx);
    assert.is(client.hello.name, 'torpor-testvm 1');
    assert.is(client.hello.version, 1);
    const rttMs = await client.ping();
    // The rendezvous was the knock: one, counted by the device (the guest knocks once it listens).
    assert.is(machine.vsockKnocks(1023), 1);
    assert.ok(rttMs > 0 && rttMs < 1000, `PING round trip ${rttMs} ms`);

    // The guest took the Linux command line as it is and saw the devices Sandbox.create configured:
    // the root filesystem as virtio-blk disk 0 (capacity in 512-byte sectors), vsock with CID 3
    // and the network (virtio-net, its addresses on the command line for the agent).
    assert.ok(machine.kernelCmdline.startsWith(`${GUEST_CMDLINE} ${AGENT_READY}`), machine.kernelCmdline);
    const log = sbx.consoleLog();
    const sectors = statSync(meta.rootfs).size / ROOTFS_SECTOR;
    assert.match(log, new RegExp(`^virtio=0 type=blk .*capacity=${sectors} status=ok$`, 'm'));
    assert.match(log, /^virtio=1 type=vsock .*cid=3 status=ok$/m);
    assert.match(log, /^virtio=2 type=net .*status=ok$/m);
    assert.match(machine.kernelCmdline, / torpor\.net=10\.0\.2\.15\/24,10\.0\.2\.2,10\.0\.2\.3 /);
    assert.match(log, /^boot=ok ram_mib=\d+ virtio=3 blk=1 rng=0 vsock=1 mode=irq$/m);
    assert.match(log, /^torpor-agent ready v1 \d+ vsock:1024$/m);
    assert.not.match(log, /error|bad_virtio_entries/);
    // console.log in the directory holds the same output.
    assert.match(await readFile(join(dir, 'console.log'), 'utf8'), /torpor-agent ready v1 \d+ vsock:1024/);

    // The test guest's agent offers no exec: the API refuses clearly, naming the agent.
    const err = await sbx.commands.run('true').catch((e: unknown) => e);
    assert.ok(err instanceof TorporError && err.code === 'REQUEST_FAILED', String(err));
    assert.match((err as Error).message, /the agent \(torpor-testvm 1\) does not offer exec/);

    console.log(`  sandbox-testvm: Sandbox.create -> HELLO ${createMs.toFixed(0)} ms, PING ${rttMs.toFixed(2)} ms, guest ${/ready v1 (\d+)/.exec(log)![1]} ms after entry`);

    // kill(): the machine stops, its VM is closed, the directory is deleted; a second kill is a no-op.
    await sbx.kill();
    assert.is(machine.state, 'stopped');
    assert.is(await settledVms(vmsBefore), vmsBefore);
    assert.not.ok(existsSync(dir));
    assert.equal(await sandboxDirs(), []);
    await sbx.kill();
  } finally {
    await sbx.kill();
  }
});

kvmTest('a guest that stops after boot: requests fail with CONNECTION_CLOSED saying how the machine ended', async () => {
  const sbx = await Sandbox.create(bootOpts(AGENT_READY));
  try {
    const { machine, client } = internals(sbx);
    const ended = new Promise<void>((resolve) => machine.once('exit', () => resolve()));
    // Machines and idle agent sessions do not keep Node alive, so with nothing else pending Node
    // would reach beforeExit, which pauses running sandboxes (docs/sandbox-lifecycle.md): a
    // timer holds the loop while the guest faults, as an application waiting on it would.
    const holdLoop = setInterval(() => undefined, 1000);
    machine.consoleWrite('triple\n'); // the test guest's serial command: a triple fault now
    await ended.finally(() => clearInterval(holdLoop));
    const err = await client.ping().catch((e: unknown) => e);
    assert.ok(err instanceof TorporError && err.code === 'CONNECTION_CLOSED', String(err));
    assert.match((err as Error).message, /the sandbox.s machine ended \(failed, triple-fault: /);
    assert.match((err as Error).message, /console: triple=now/);
  } finally {
    await sbx.kill();
  }
});

kvmTest('await using kills the sandbox at the end of the block', async () => {
  let dir = '';
  let machine: Machine | undefined;
  {
    await using sbx = await Sandbox.create(bootOpts(AGENT_READY));
    ({ dir, machine } = internals(sbx));
    assert.ok(existsSync(join(dir, 'meta.json')));
    assert.is(machine.state, 'running');
  }
  assert.is(machine.state, 'stopped');
  assert.not.ok(existsSync(dir));
  assert.is(await settledVms(vmsBefore), vmsBefore);
});

kvmTest('4 sandboxes at once: distinct ids, directories and agents', async () => {
  const t0 = performance.now();
  const boxes = await allOrNone(Array.from({ length: 4 }, () => Sandbox.create(bootOpts(AGENT_READY))), (b) => b.kill());
  const ms = performance.now() - t0;
  try {
    const ids = boxes.map((b) => b.id);
    assert.is(new Set(ids).size, 4);
    assert.equal(await sandboxDirs(), [...ids].sort());
    assert.is(liveVms(), vmsBefore + 4);
    const rtts = await Promise.all(boxes.map((b) => internals(b).client.ping()));
    assert.ok(rtts.every((r) => r > 0));
    for (const b of boxes) assert.is(internals(b).client.hello.name, 'torpor-testvm 1');
    console.log(`  sandbox-testvm: 4 concurrent creates ${ms.toFixed(0)} ms`);
  } finally {
    await Promise.all(boxes.map((b) => b.kill()));
  }
  assert.equal(await sandboxDirs(), []);
  assert.is(await settledVms(vmsBefore), vmsBefore);
});

kvmTest('a later create in the same process notices a replaced kernel file and uses the new one', async () => {
  const mine = join(home, 'my-kernel.elf');
  await copyFile(kernel, mine);
  const metaKernel = async (sbx: Sandbox) => JSON.parse(await readFile(join(internals(sbx).dir, 'meta.json'), 'utf8')).kernel as string;
  const opts = { ...bootOpts(AGENT_READY), boot: { kernel: mine, cmdlineExtra: AGENT_READY, timeoutMs: bound(15_000) } };
  const first = await Sandbox.create(opts);
  const before = await metaKernel(first);
  await first.kill();
  const again = await Sandbox.create(opts); // same file: reused without asking the store again
  assert.is(await metaKernel(again), before);
  await again.kill();
  // Trailing bytes keep the ELF valid but change its content (and so its store entry).
  await writeFile(mine, Buffer.concat([await readFile(kernel), Buffer.from('torpor')]));
  const replaced = await Sandbox.create(opts);
  try {
    const after = await metaKernel(replaced);
    assert.is.not(after, before);
    assert.equal(await readFile(after), await readFile(mine));
  } finally {
    await replaced.kill();
  }
});

kvmTest('opts.timeoutMs kills the sandbox when its lifetime is up', async () => {
  const sbx = await Sandbox.create({ ...bootOpts(AGENT_READY), timeoutMs: 300 });
  const { dir, machine } = internals(sbx);
  try {
    assert.ok(existsSync(dir));
    for (let i = 0; i < 100 && existsSync(dir); i++) await sleep(50);
    assert.not.ok(existsSync(dir), 'directory removed after the lifetime');
    assert.is(machine.state, 'stopped');
  } finally {
    await sbx.kill();
  }
});

kvmTest('no knock: BOOT_FAILED after the boot timeout, with the console tail, nothing left behind', async () => {
  const t0 = performance.now();
  const err = await Sandbox.create(bootOpts(undefined, 1500)).catch((e: unknown) => e);
  const ms = performance.now() - t0;
  assert.ok(err instanceof TorporError && err.code === 'BOOT_FAILED', String(err));
  const msg = (err as Error).message;
  assert.match(msg, /did not knock on vsock port 1023 within 1500 ms/);
  assert.match(msg, /Last console output:\ntorpor-testvm ready\n/);
  assert.match(msg, /boot=ok [^\n]*vsock=1/);
  assert.ok(ms >= 1500 && ms < 10_000, `${ms} ms`);
  assert.equal(await sandboxDirs(), []);
  assert.is(await settledVms(vmsBefore), vmsBefore);
});

kvmTest('a guest that stops during boot: BOOT_FAILED at once, saying it stopped, nothing left behind', async () => {
  const t0 = performance.now();
  // testvm.run=triple: the guest triple-faults right after its boot line (a panicking kernel with
  // panic=1 ends the same way, by resetting).
  const err = await Sandbox.create(bootOpts('testvm.run=triple')).catch((e: unknown) => e);
  const ms = performance.now() - t0;
  assert.ok(err instanceof TorporError && err.code === 'BOOT_FAILED', String(err));
  const msg = (err as Error).message;
  assert.match(msg, /the guest failed before its agent knocked \(triple-fault/);
  assert.match(msg, /triple=now/);
  assert.ok(ms < 10_000, `did not wait for the 15 s boot timeout (${ms} ms)`);
  assert.equal(await sandboxDirs(), []);
  assert.is(await settledVms(vmsBefore), vmsBefore);
});

kvmTest('network: a forwarded port is listening at getHost(port); network: false means no device', async () => {
  {
    await using sbx = await Sandbox.create({ ...bootOpts(AGENT_READY), network: { ports: [8080] } });
    const host = sbx.getHost(8080);
    assert.match(host, /^127\.0\.0\.1:\d+$/);
    // passt listens there (the test guest serves nothing on 8080: the connection is accepted, then dropped).
    const [, port] = host.split(':');
    const { connect } = await import('node:net');
    await new Promise<void>((resolve, reject) => {
      const c = connect(Number(port), '127.0.0.1', () => {
        c.destroy();
        resolve();
      });
      c.once('error', reject);
    });
    const err = (() => {
      try {
        sbx.getHost(9090);
      } catch (e) {
        return e;
      }
    })();
    assert.ok(err instanceof TorporError && err.code === 'INVALID_ARGUMENT', String(err));
  }
  {
    await using sbx = await Sandbox.create({ ...bootOpts(AGENT_READY), network: false });
    assert.not.match(sbx.consoleLog(), /type=net/);
    assert.throws(() => sbx.getHost(8080), (e: unknown) => e instanceof TorporError && e.code === 'INVALID_ARGUMENT');
  }
  const bad = await Sandbox.create({ ...bootOpts(AGENT_READY), network: { ports: [0] } }).catch((e: unknown) => e);
  assert.ok(bad instanceof TorporError && bad.code === 'INVALID_ARGUMENT', String(bad));
  assert.equal(await sandboxDirs(), []);
});

test.run();
