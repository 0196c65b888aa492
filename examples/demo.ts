// npm run demo: the main job. A Linux sandbox runs python3 and writes and reads back a file.
// - A host whose /dev/kvm boots Linux (hardware virtualization): right here.
// - A host where Linux cannot boot natively (PVM, or no /dev/kvm at all): the same demo inside
//   the nested KVM host (an L1 Linux under QEMU's emulator with emulated AMD SVM, which needs no
//   /dev/kvm; docs/nested.md), labelled emulated.
// - Neither possible (no QEMU, no addon): one line saying why, and what would make it work.
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { detectHost } from '../lib/setup/host.js';
import { runInNestedHost } from './nested-host.js';

const nested = process.env.TORPOR_NESTED === '1';
const where = nested ? 'sandbox, nested, EMULATED' : 'sandbox';

/** Pause `sbx`, then continue it in a new Node process (examples/demo-continue.ts). */
async function pauseAndContinue(sbx: Sandbox, kind: 'linux' | 'testvm', label: string): Promise<boolean> {
  const t0 = performance.now();
  const r = await sbx.pause();
  console.log(
    `[${label}] paused in ${(performance.now() - t0).toFixed(0)} ms (captured ${r.capturedMs.toFixed(0)} ms, durable ${r.durableMs.toFixed(0)} ms, ` +
      `generation ${r.generation}); ${((await Sandbox.getInfo(sbx.sandboxId)).bytesOnDisk / 2 ** 20).toFixed(1)} MiB on disk`,
  );
  const c = spawnSync(process.execPath, ['--import', 'tsx', 'examples/demo-continue.ts', kind, sbx.sandboxId, label], {
    cwd: fileURLToPath(new URL('..', import.meta.url)),
    stdio: 'inherit',
  });
  return c.status === 0;
}

/** Where no Linux guest boots: the same pause-and-continue with the test guest standing in. */
async function demoTestGuest(): Promise<boolean> {
  const { testvmImage } = await import('../test/vmm-guests.js');
  const kernel = testvmImage();
  if (!kernel) {
    console.log('(The test guest is not built either: make -C guest/testvm shows pause-and-continue with it.)');
    return true;
  }
  const label = 'test guest';
  const sbx = await Sandbox.create({ vcpus: 1, memoryMiB: 64, boot: { kernel, cmdlineExtra: 'testvm.agent_ready=1 testvm.count=1', timeoutMs: 15_000 } });
  await new Promise((r) => setTimeout(r, 500));
  const counter = (sbx as unknown as { machine: { readGuest(a: number, n: number): Buffer } }).machine.readGuest(0x100008, 8).readBigUInt64LE();
  console.log(`[${label}] ${sbx.sandboxId} counting in guest memory: ${counter}`);
  return pauseAndContinue(sbx, 'testvm', label);
}

async function demoHere(): Promise<void> {
  if (nested) console.log('Inside the nested KVM host: everything below runs emulated, so its timings are not performance figures.');
  const t0 = performance.now();
  await using sbx = await Sandbox.create();
  console.log(`[${where}] ${sbx.id} ready in ${(performance.now() - t0).toFixed(0)} ms`);
  const py = await sbx.commands.run(['python3', '-c', 'import sys; print(sum(range(101)), sys.version.split()[0])'], {
    throwOnError: false,
  });
  console.log(`[${where}] python3 -> ${py.exitCode === 0 ? py.stdout.trim() : `exit ${py.exitCode}: ${py.stderr.trim()}`}`);
  const path = '/home/user/torpor-demo.txt';
  await sbx.files.write(path, 'hello from torpor\n');
  const text = await sbx.files.read(path);
  console.log(`[${where}] wrote and read back ${path}: ${JSON.stringify(text)}`);
  const info = await sbx.files.getInfo(path);
  console.log(`[${where}] getInfo: ${info.type}, ${info.size} bytes, owner ${info.owner}`);
  // A job in the background, the sandbox paused, a new Node process continuing it.
  await sbx.files.write('/tmp/job.py', 'import time\nn = 0\nwhile True:\n    with open("/tmp/job.log", "a") as f:\n        f.write(f"{n}\\n")\n    n += 1\n    time.sleep(0.05)\n');
  await sbx.commands.run('python3 /tmp/job.py', { background: true });
  // Its first line, however long python3 takes to start (seconds when emulated): waited for in the guest, up to 2 minutes.
  const first = await sbx.commands.run('for i in $(seq 1200); do [ -s /tmp/job.log ] && break; sleep 0.1; done; sleep 1; tail -1 /tmp/job.log', { timeoutMs: 150_000 });
  console.log(`[${where}] background job: tail -1 /tmp/job.log -> ${first.stdout.trim()}`);
  const continued = await pauseAndContinue(sbx, 'linux', where);
  if (!continued || py.exitCode !== 0 || text !== 'hello from torpor\n') process.exitCode = 1;
}

const support = await linuxGuestSupport();
if (support.ok) {
  await demoHere();
} else if (nested) {
  // Inside L1 the probe must say hardware; if it does not, say so rather than loop.
  console.log(`The nested KVM host cannot boot a Linux guest either: ${support.reason}`);
  process.exitCode = 1;
} else {
  const host = await detectHost();
  if (host.kvm) {
    console.log(`No Linux guest boots on this host's KVM (${host.kind}): pause and continue shown with the test guest standing in for Linux:`);
    if (!(await demoTestGuest())) process.exitCode = 1;
  }
  // The nested host is QEMU's emulator: it needs no /dev/kvm, so a host without one runs the
  // demo there too, as a PVM host does.
  process.exitCode = runInNestedHost(host, 'examples/demo.ts');
}
