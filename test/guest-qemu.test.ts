// The guest half without our VMM: QEMU's emulator (TCG, so any host works,
// PVM included) boots our kernel and root filesystem, and the agent (PID 1)
// prints its readiness line on the serial console.
import { spawn, spawnSync } from 'node:child_process';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { ensureArtifacts } from '../lib/setup/artifacts.js';
import { builtKernel } from '../lib/setup/kernel.js';
import { formatEvent } from '../lib/setup/progress.js';
import { homeLayout } from '../lib/store/home.js';
import { needsSetup, testUnless } from './skip-unless.js';

const QEMU = 'qemu-system-x86_64';
/** TCG boots this kernel to the agent in seconds; the bound covers a loaded 2-core CI machine. */
const BOOT_TIMEOUT_MS = 240_000;

function haveQemu(): boolean {
  return spawnSync(QEMU, ['--version'], { stdio: 'ignore' }).status === 0;
}

const noQemu = haveQemu() ? null : `${QEMU} is not installed (apt-get install qemu-system-x86)`;
const qemuTest = noQemu ? testUnless('guest-qemu', noQemu, 'tools') : testUnless('guest-qemu', await needsSetup(), 'artifacts');

qemuTest('QEMU (TCG) boots our kernel + rootfs to the agent readiness line', async () => {
  const report = await ensureArtifacts({ onProgress: (e) => e.status !== 'step' && console.log(`  ${formatEvent(e)}`) });
  // Always our own kernel: a supplied one (TORPOR_KERNEL) is built for some host's PVM, not for QEMU.
  const kernel = report.kernelOrigin === 'built' ? report.kernel : (await builtKernel(homeLayout().artifacts, false)).path;

  // microvm: virtio-mmio devices declared on the command line, no ACPI (MP table
  // from qboot), like torpor's own platform. snapshot=on: the stored image is never written.
  const args = [
    '-accel', 'tcg', '-M', 'microvm,acpi=off', '-cpu', 'max', '-m', '512', '-smp', '2',
    '-display', 'none', '-monitor', 'none', '-serial', 'stdio', '-no-reboot',
    '-kernel', kernel,
    '-append', 'console=ttyS0 root=/dev/vda rw reboot=k panic=1 pci=off init=/usr/sbin/torpor-agent',
    '-drive', `id=root,file=${report.rootfs},format=raw,if=none,snapshot=on`,
    '-device', 'virtio-blk-device,drive=root',
  ];
  const started = Date.now();
  const qemu = spawn(QEMU, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let console_ = '';
  const ready = await new Promise<string | undefined>((resolve) => {
    const timer = setTimeout(() => resolve(undefined), BOOT_TIMEOUT_MS);
    const onData = (d: Buffer): void => {
      console_ += d.toString('latin1');
      const m = /torpor-agent ready v1 ([^\r\n]*)\r?\n/.exec(console_);
      if (m) {
        clearTimeout(timer);
        resolve(m[0].trim());
      } else if (/Kernel panic/.test(console_)) {
        clearTimeout(timer);
        setTimeout(() => resolve(undefined), 200);
      }
    };
    qemu.stdout.on('data', onData);
    qemu.stderr.on('data', onData);
    qemu.on('exit', () => {
      clearTimeout(timer);
      resolve(undefined);
    });
  });
  const elapsed = Date.now() - started;
  qemu.kill('SIGKILL');
  await new Promise((r) => (qemu.exitCode !== null || qemu.signalCode !== null ? r(null) : qemu.on('exit', r)));
  if (!ready) console.log(console_.split('\n').slice(-40).join('\n'));
  assert.ok(ready, `no readiness line within ${BOOT_TIMEOUT_MS / 1000} s`);
  assert.match(console_, /Linux version 6\.1\.\d+-torpor/);
  assert.match(console_, /EXT4-fs \(vda\): mounted filesystem/);
  assert.match(console_, /Run \/usr\/sbin\/torpor-agent as init process/);
  console.log(`  QEMU TCG: process start -> "${ready}" in ${(elapsed / 1000).toFixed(1)} s`);
});

test.run();
