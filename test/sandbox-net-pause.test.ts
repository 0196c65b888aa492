// A sandbox's network across pause and connect (docs/network.md, "Pause and resume"), with the
// test guest standing in for Linux (as in sandbox-pause.test.ts): the guest ARPs for the gateway
// through virtio-net (guest/testvm's net-arp), so an answer proves the device, the socketpair and
// a live passt end to end. Pause ends passt; connect (from memory, and the disk-boot fallback)
// starts a fresh one with the same MAC and forwarded ports, attached before the guest runs.
//
// TORPOR_HOME is a fresh directory whose artifacts/ links to the real store.
import { readdir, readFile } from 'node:fs/promises';
import net from 'node:net';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { macFor } from '../lib/net/options.js';
import { Sandbox } from '../lib/sandbox/sandbox.js';
import { newSandboxId, parseMeta } from '../lib/store/sandbox-dir.js';
import type { Machine } from '../lib/vm/machine.js';
import { privateHome, testvmSandboxTest } from './sandbox-home.js';
import { needsCommands } from './skip-unless.js';
import { sleep, testvmCommand, testvmImage, testvmSkipReason } from './vmm-guests.js';

const kvmTest = await testvmSandboxTest('sandbox-net-pause', testvmSkipReason() ?? needsCommands('passt'));
const kernel = testvmImage()!;

// Booted (template: false): the MAC is the sandbox's own (a template sandbox keeps the
// template's; sandbox-template.test.ts).
const bootOpts = {
  template: false as const,
  vcpus: 1,
  memoryMiB: 64,
  boot: { kernel, timeoutMs: 15_000, cmdlineExtra: 'testvm.agent_ready=1' },
  network: { ports: [8080] },
};
const machineOf = (sbx: Sandbox) => (sbx as unknown as { machine: Machine }).machine;

/** The guest's ARP for the gateway, through the device and whatever backend is attached now. */
async function arp(sbx: Sandbox): Promise<string> {
  return testvmCommand(machineOf(sbx), 'net-arp', 'net-arp');
}

/** passt processes this process started (children named passt, or passt.avx2: what Debian's passt execs). */
async function passtChildren(): Promise<number[]> {
  const pids: number[] = [];
  for (const name of await readdir('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const stat = await readFile(`/proc/${name}/stat`, 'utf8').catch(() => '');
    const m = /^\d+ \((.*)\) \S+ (\d+) /.exec(stat);
    if (m && m[1]!.startsWith('passt') && Number(m[2]) === process.pid) pids.push(Number(name));
  }
  return pids;
}

async function until(cond: () => boolean | Promise<boolean>, what: string, ms = 5_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(20);
  }
}

/** Whether something accepts TCP connections on 127.0.0.1:port. */
function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const c = net.connect(port, '127.0.0.1', () => {
      c.destroy();
      resolve(true);
    });
    c.once('error', () => resolve(false));
  });
}

const portOf = (host: string) => Number(host.split(':')[1]);

const home = privateHome(test, 'torpor-sbx-net-pause-');

test('meta.json: the network and host ports are checked before a resume uses them', () => {
  const id = newSandboxId();
  const meta = {
    id, template: 'base', createdAt: '2026-12-01T18:00:00.000Z', vcpus: 1, memoryMiB: 64, metadata: {}, envs: {},
    kernel: '/k', rootfs: '/r', cmdline: 'console=ttyS0', state: 'paused', ownerPid: null,
    network: { egress: true, allowHostLoopback: false, ports: [8080] },
    hostPorts: { '8080': 40123 },
  };
  assert.equal(parseMeta(JSON.stringify(meta), 'meta.json'), meta);
  const bad: Array<[string, Record<string, unknown>, RegExp]> = [
    ['network not an object', { network: true }, /network is malformed/],
    ['a port out of range', { network: { ...meta.network, ports: [70000] } }, /network is malformed/],
    ['egress missing', { network: { allowHostLoopback: false, ports: [] } }, /network is malformed/],
    ['a host port out of range', { hostPorts: { '8080': 0 } }, /hostPorts is malformed/],
    ['a guest port that is no number', { hostPorts: { x: 40123 } }, /hostPorts is malformed/],
    ['hostPorts an array', { hostPorts: [40123] }, /hostPorts is malformed/],
  ];
  for (const [what, change, re] of bad) {
    const err = (() => {
      try {
        parseMeta(JSON.stringify({ ...meta, ...change }), 'meta.json');
      } catch (e) {
        return e;
      }
    })();
    assert.ok(err instanceof TorporError && err.code === 'SNAPSHOT_INVALID', `${what}: ${String(err)}`);
    assert.match((err as Error).message, re, what);
  }
});

kvmTest('pause ends passt; connect starts a fresh one: same MAC, the guest ARPs through it, its forwarded port bound again', async () => {
  const sbx = await Sandbox.create(bootOpts);
  const id = sbx.sandboxId;
  const mac = macFor(id).replaceAll(':', '');
  let again: Sandbox | undefined;
  try {
    assert.match(await arp(sbx), new RegExp(`^net-arp=ok mac=${mac} link=1 `));
    const [first] = await passtChildren();
    assert.ok(first, 'a passt runs beside the machine');
    const host1 = sbx.getHost(8080);
    assert.ok(await accepts(portOf(host1)));

    await sbx.pause();
    // The backend ended after the capture, its forwarded port with it.
    assert.equal(await passtChildren(), []);
    assert.not.ok(await accepts(portOf(host1)), 'nothing listens on the old host port while paused');
    const meta = JSON.parse(await readFile(join(home, 'sandboxes', id, 'meta.json'), 'utf8'));
    assert.equal(meta.network, { egress: true, allowHostLoopback: false, ports: [8080] });
    assert.equal(meta.hostPorts, { '8080': portOf(host1) });
    assert.match(meta.cmdline, /torpor\.net=10\.0\.2\.15\/24,10\.0\.2\.2,10\.0\.2\.3/);

    again = await Sandbox.connect(id);
    assert.is((await again.getInfo()).resumedFrom, 'memory');
    const passts = await passtChildren();
    assert.is(passts.length, 1);
    assert.is.not(passts[0], first, 'a new passt process');
    // The snapshot kept the device and its MAC; the new backend answers.
    assert.match(await arp(again), new RegExp(`^net-arp=ok mac=${mac} link=1 gateway=[0-9a-f]{12}$`));
    // The old host port was free again: the same one.
    assert.is(again.getHost(8080), host1);
    assert.ok(await accepts(portOf(host1)));
  } finally {
    await (again ?? sbx).kill();
  }
  await until(async () => (await passtChildren()).length === 0, 'passt to end with kill()');
});

kvmTest('connect when the old host port is taken: getHost names the new one; the disk-boot fallback gets a backend too', async () => {
  const sbx = await Sandbox.create(bootOpts);
  const id = sbx.sandboxId;
  const mac = macFor(id).replaceAll(':', '');
  const host1 = sbx.getHost(8080);
  await sbx.pause();
  // Someone else binds the old port while the sandbox is paused.
  const squatter = net.createServer((c) => c.destroy());
  await new Promise<void>((resolve) => squatter.listen(portOf(host1), '127.0.0.1', resolve));
  let again: Sandbox | undefined;
  try {
    again = await Sandbox.connect(id);
    const host2 = again.getHost(8080);
    assert.is.not(host2, host1);
    assert.ok(await accepts(portOf(host2)));
    assert.match(await arp(again), new RegExp(`^net-arp=ok mac=${mac} link=1 `));
    const meta = JSON.parse(await readFile(join(home, 'sandboxes', id, 'meta.json'), 'utf8'));
    assert.equal(meta.hostPorts, { '8080': portOf(host2) });

    // The disk boot (onResume 'reboot'): a new machine built with the same MAC and a new passt.
    await again.pause();
    assert.equal(await passtChildren(), []);
    again = await Sandbox.connect(id, { onResume: 'reboot' });
    assert.is((await again.getInfo()).resumedFrom, 'disk');
    assert.is((await passtChildren()).length, 1);
    assert.match(await arp(again), new RegExp(`^net-arp=ok mac=${mac} link=1 gateway=[0-9a-f]{12}$`));
    assert.is(again.getHost(8080), host2, 'the port of the last run, free again');
    assert.ok(await accepts(portOf(host2)));
  } finally {
    await (again ?? sbx).kill();
    await new Promise((resolve) => squatter.close(resolve));
  }
  await until(async () => (await passtChildren()).length === 0, 'passt to end with kill()');
});

kvmTest("the network backend dying on its own is an 'error' event (NET_BACKEND); pause and connect start a new one", async () => {
  const sbx = await Sandbox.create(bootOpts);
  let again: Sandbox | undefined;
  try {
    const [passt] = await passtChildren();
    assert.ok(passt, 'a passt runs beside the machine');
    const failed = new Promise<Error>((r) => sbx.once('error', r));
    process.kill(passt!, 'SIGKILL');
    const alive = setInterval(() => undefined, 1000); // nothing else keeps the process alive meanwhile
    const err = await failed.finally(() => clearInterval(alive));
    assert.ok(err instanceof TorporError && err.code === 'NET_BACKEND', String(err));
    assert.match(err.message, /signal SIGKILL/);
    assert.match(err.message, /pause and connect start a new one/);
    assert.is(sbx.state, 'running', 'the sandbox runs on without a network');
    assert.throws(() => sbx.getHost(8080), /passt/);
    await sbx.pause();
    again = await Sandbox.connect(sbx.sandboxId);
    assert.is((await passtChildren()).length, 1, 'a new backend');
    assert.match(await arp(again), /^net-arp=ok /);
  } finally {
    await (again ?? sbx).kill();
  }
});

kvmTest('network: false stays off across pause and connect', async () => {
  const sbx = await Sandbox.create({ ...bootOpts, network: false });
  const id = sbx.sandboxId;
  assert.equal(await passtChildren(), []);
  await sbx.pause();
  const again = await Sandbox.connect(id);
  try {
    assert.equal(await passtChildren(), []);
    assert.is(await arp(again), 'net-arp=error reason=no-device');
    const meta = JSON.parse(await readFile(join(home, 'sandboxes', id, 'meta.json'), 'utf8'));
    assert.is(meta.network, undefined);
  } finally {
    await again.kill();
  }
});

test.run();
