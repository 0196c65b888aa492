// The guest kernel: our build is a vmlinux carrying the PVH entry note with the
// config we asked for; a supplied kernel is checked and anything that is not a
// bootable x86-64 kernel is refused with KERNEL_INVALID.
import { execFileSync } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { ensureArtifacts } from '../lib/setup/artifacts.js';
import { builtKernel, suppliedKernel } from '../lib/setup/kernel.js';
import { classifyKernel, inspectKernel } from '../lib/setup/kernel-format.js';
import { kernelDir } from '../lib/setup/paths.js';
import { formatEvent } from '../lib/setup/progress.js';
import { requireTools } from '../lib/setup/tools.js';
import { homeLayout } from '../lib/store/home.js';

/** A minimal bzImage setup header (Documentation/x86/boot.rst). */
function bzImageHeader(protocol: number, xloadflags: number): Buffer {
  const buf = Buffer.alloc(0x1000);
  buf.writeUInt16LE(0xaa55, 0x1fe);
  buf.write('HdrS', 0x202, 'latin1');
  buf.writeUInt16LE(protocol, 0x206);
  buf.writeUInt16LE(xloadflags, 0x236);
  return buf;
}

function refusedWith(fn: () => unknown, pattern: RegExp): void {
  try {
    fn();
  } catch (err) {
    assert.instance(err, TorporError);
    assert.is((err as TorporError).code, 'KERNEL_INVALID');
    assert.match((err as Error).message, pattern);
    return;
  }
  assert.unreachable('accepted a file that is not a bootable kernel');
}

test('a bzImage with the 64-bit boot protocol (>= 2.12, XLF_KERNEL_64) is accepted', () => {
  const info = classifyKernel(bzImageHeader(0x20f, 0x7f), 0x1000);
  assert.is(info.format, 'bzimage');
  assert.is(info.protocol, 0x20f);
});

test('an old or 32-bit-only bzImage is refused', () => {
  refusedWith(() => classifyKernel(bzImageHeader(0x20a, 1), 0x1000), /older than 2\.12/);
  refusedWith(() => classifyKernel(bzImageHeader(0x20f, 0), 0x1000), /XLF_KERNEL_64/);
});

test('files that are none of the accepted forms are refused with KERNEL_INVALID', async () => {
  refusedWith(() => classifyKernel(Buffer.from('root:x:0:0:root:/root:/bin/bash\n'), 33), /neither an ELF file nor a bzImage/);
  refusedWith(() => classifyKernel(Buffer.from([0x7f, 0x45, 0x4c, 0x46, 2, 1]), 6), /truncated/);
  // A real program is an ELF file, but not a kernel.
  const program = await readFile(process.execPath);
  refusedWith(() => classifyKernel(program, program.length), /not an executable image|no kernel-space segments/);
  const dir = await mkdtemp(join(tmpdir(), 'torpor-kernel-test-'));
  try {
    const empty = join(dir, 'empty');
    await writeFile(empty, '');
    const err = await inspectKernel(empty).catch((e: unknown) => e);
    assert.is((err as TorporError).code, 'KERNEL_INVALID');
    const missing = await inspectKernel(join(dir, 'nope')).catch((e: unknown) => e);
    assert.is((missing as TorporError).code, 'KERNEL_INVALID');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('a bad TORPOR_KERNEL is refused before anything is built', async () => {
  const home = await mkdtemp(join(tmpdir(), 'torpor-kernel-home-'));
  try {
    const bogus = join(home, 'vmlinux');
    await writeFile(bogus, 'not a kernel at all');
    const err = await ensureArtifacts({ home, kernel: bogus }).catch((e: unknown) => e);
    assert.instance(err, TorporError);
    assert.is((err as TorporError).code, 'KERNEL_INVALID');
    assert.match((err as Error).message, /is not a kernel torpor can boot/);
    assert.equal(await readdir(join(home, 'artifacts')), [], 'nothing was built');
  } finally {
    await rm(home, { recursive: true, force: true });
  }
});

test('our kernel: a vmlinux with the PVH entry note, built from the verified config', async () => {
  try {
    requireTools(['kernel']);
  } catch (err) {
    console.log(`  skipped building our kernel: ${(err as Error).message}`);
    return;
  }
  const root = homeLayout().artifacts;
  const started = Date.now();
  const kernel = await builtKernel(root, false, (e) => {
    if (e.status !== 'step') console.log(`  ${formatEvent(e)}`);
  });
  if (kernel.artifact.built) console.log(`  built the guest kernel in ${((Date.now() - started) / 1000).toFixed(0)} s`);
  const info = await inspectKernel(kernel.path);
  assert.is(info.format, 'elf-pvh');
  assert.ok(info.entry! > 0x100000 && info.entry! < 0x100000000, 'the PVH entry is a 32-bit physical address');
  const config = await readFile(join(kernel.artifact.dir, 'config'), 'utf8');
  assert.match(config, /^CONFIG_PVH=y$/m);
  assert.match(config, /^CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES=y$/m);
  assert.match(config, /^# CONFIG_MODULES is not set$/m);
  assert.match(config, /^# CONFIG_ACPI is not set$/m);
  const verified = execFileSync(join(kernelDir, 'verify-config.sh'), [join(kernelDir, 'torpor.config'), join(kernel.artifact.dir, 'config')], {
    encoding: 'utf8',
  });
  assert.match(verified, /all \d+ requested options set/);

  // verify-config.sh fails loudly, naming the option, when one did not survive.
  const dir = await mkdtemp(join(tmpdir(), 'torpor-kernel-test-'));
  try {
    const broken = join(dir, 'config');
    await writeFile(broken, config.replace(/^CONFIG_PVH=y$/m, '# CONFIG_PVH is not set'));
    let failed = '';
    try {
      execFileSync(join(kernelDir, 'verify-config.sh'), [join(kernelDir, 'torpor.config'), broken], { stdio: 'pipe' });
    } catch (err) {
      failed = String((err as { stderr: Buffer }).stderr);
    }
    assert.match(failed, /CONFIG_PVH: wanted y, got <not set>/);

    // The same file supplied by a user is checked, copied into the store by content, and reused.
    const supplied = await suppliedKernel(kernel.path, join(dir, 'artifacts'), false);
    assert.is(supplied.origin, 'supplied');
    assert.is(supplied.info.format, 'elf-pvh');
    assert.ok(supplied.artifact.built);
    assert.is(supplied.sha256, kernel.sha256);
    const again = await suppliedKernel(kernel.path, join(dir, 'artifacts'), false);
    assert.not.ok(again.artifact.built);
    assert.is(again.path, supplied.path);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test.run();
