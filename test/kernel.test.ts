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
import { builtKernel, builtKernelSpec, suppliedKernel } from '../lib/setup/kernel.js';
import { baseInputs } from '../lib/setup/rootfs.js';
import { artifactKey } from '../lib/store/artifact.js';
import { classifyKernel, inspectKernel } from '../lib/setup/kernel-format.js';
import { kernelDir } from '../lib/setup/paths.js';
import { formatEvent } from '../lib/setup/progress.js';
import { toolsError } from '../lib/setup/tools.js';
import { homeLayout } from '../lib/store/home.js';
import { testUnless } from './skip-unless.js';

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

/** A minimal ELF64 x86-64 vmlinux: one PT_LOAD in the kernel half, one PT_NOTE holding the PVH entry note. */
function elfWithPvhNote(entry = 0x1000000): Buffer {
  const buf = Buffer.alloc(0x200);
  buf.writeUInt32BE(0x7f454c46, 0);
  buf[4] = 2; // ELFCLASS64
  buf[5] = 1; // little-endian
  buf[6] = 1;
  buf.writeUInt16LE(2, 0x10); // ET_EXEC
  buf.writeUInt16LE(62, 0x12); // EM_X86_64
  buf.writeBigUInt64LE(0xffffffff81000000n, 0x18);
  buf.writeBigUInt64LE(0x40n, 0x20); // phoff
  buf.writeUInt16LE(64, 0x34);
  buf.writeUInt16LE(56, 0x36); // phentsize
  buf.writeUInt16LE(2, 0x38); // phnum
  // PT_LOAD
  buf.writeUInt32LE(1, 0x40);
  buf.writeBigUInt64LE(0x100n, 0x40 + 8);
  buf.writeBigUInt64LE(0xffffffff81000000n, 0x40 + 16);
  buf.writeBigUInt64LE(0x100n, 0x40 + 32);
  // PT_NOTE at 0x100: namesz 4, descsz 4, type 18, "Xen\0", entry
  buf.writeUInt32LE(4, 0x78);
  buf.writeBigUInt64LE(0x100n, 0x78 + 8);
  buf.writeBigUInt64LE(20n, 0x78 + 32);
  buf.writeUInt32LE(4, 0x100);
  buf.writeUInt32LE(4, 0x104);
  buf.writeUInt32LE(18, 0x108);
  buf.write('Xen\0', 0x10c, 'latin1');
  buf.writeUInt32LE(entry, 0x110);
  return buf;
}

/** classifyKernel's contract on untrusted bytes: a KernelInfo or KERNEL_INVALID, nothing else. */
function classifyOrRefuse(buf: Buffer): 'ok' | 'refused' {
  try {
    classifyKernel(buf, buf.length);
    return 'ok';
  } catch (err) {
    if (err instanceof TorporError && err.code === 'KERNEL_INVALID') return 'refused';
    throw new Error(`a crafted file escaped as ${(err as Error).name}: ${(err as Error).message}`);
  }
}

/** A small deterministic PRNG (xorshift32), so a failure names a reproducible seed. */
function prng(seed: number): () => number {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x;
  };
}

test('fuzz: truncated and mutated ELF and bzImage headers give KERNEL_INVALID or a result, never another exception', () => {
  const elf = elfWithPvhNote();
  assert.equal(classifyKernel(elf, elf.length), { format: 'elf-pvh', size: elf.length, entry: 0x1000000 });
  const bz = bzImageHeader(0x20f, 1);
  const started = Date.now();
  let cases = 0;
  for (const valid of [elf, bz]) {
    // Every truncation.
    for (let len = 0; len <= valid.length; len++, cases++) classifyOrRefuse(valid.subarray(0, len));
    // Extreme values in every 4-byte field of the headers, program headers and note.
    const extremes = [0, 1, 3, 4, 0x7fffffff, 0x80000000, 0xfffffffc, 0xfffffffd, 0xffffffff];
    for (let off = 0; off + 4 <= Math.min(valid.length, 0x240); off += 2) {
      for (const v of extremes) {
        const m = Buffer.from(valid);
        m.writeUInt32LE(v, off);
        classifyOrRefuse(m);
        cases++;
      }
    }
    // Random byte mutations, 1 to 8 per case.
    for (let seed = 1; seed <= 3000; seed++, cases++) {
      const rnd = prng(seed);
      const m = Buffer.from(valid);
      for (let n = 1 + (rnd() % 8); n > 0; n--) m[rnd() % Math.min(m.length, 0x240)] = rnd() & 0xff;
      try {
        classifyOrRefuse(m);
      } catch (err) {
        assert.unreachable(`seed ${seed}: ${(err as Error).message}`);
      }
    }
  }
  console.log(`  ${cases} crafted files classified in ${Date.now() - started} ms`);
});

test('crafted notes cannot read past the buffer or make classification slow', () => {
  // A note claiming a 4 GiB descriptor right at the end of the file (sizes that wrap in 32-bit arithmetic).
  for (const [namesz, descsz] of [[4, 0xfffffffd], [0xfffffffd, 8], [0xffffffff, 0xffffffff], [0x80000000, 4]] as const) {
    const m = elfWithPvhNote();
    m.writeUInt32LE(namesz, 0x100);
    m.writeUInt32LE(descsz, 0x104);
    // Not a PVH note any more: what is left is a plain 64-bit vmlinux.
    assert.is(classifyOrRefuse(m), 'ok');
    assert.is(classifyKernel(m, m.length).format, 'elf-64', `namesz ${namesz} descsz ${descsz}`);
  }
  // A PVH entry no 32-bit vCPU can start at.
  for (const entry of [0, 0xffffffff + 1]) {
    const m = Buffer.concat([elfWithPvhNote()]);
    m.writeUInt32LE(8, 0x104); // descsz 8: the entry as a 64-bit value
    m.writeBigUInt64LE(BigInt(entry), 0x110);
    m.writeBigUInt64LE(24n, 0x78 + 32);
    refusedWith(() => classifyKernel(m, m.length), /PVH entry note pointing at/);
  }
  // The same note as the last bytes of the file: a 4 GiB descriptor must not be read at all.
  const atEnd = elfWithPvhNote().subarray(0, 0x110);
  atEnd.writeUInt32LE(0xfffffffd, 0x104);
  assert.is(classifyKernel(atEnd, atEnd.length).format, 'elf-64');
  // 65535 PT_NOTE headers over one 16 MiB run of tiny notes (and a huge name size at each step).
  const big = Buffer.alloc(16 << 20);
  elfWithPvhNote().copy(big, 0, 0, 0x40);
  big.writeUInt16LE(0xffff, 0x38);
  big.writeUInt16LE(56, 0x36);
  big.writeBigUInt64LE(0x40n, 0x20);
  for (let i = 0; i < 0xffff; i++) {
    const ph = 0x40 + i * 56;
    big.writeUInt32LE(4, ph);
    big.writeBigUInt64LE(0x400000n, ph + 8);
    big.writeBigUInt64LE(BigInt(big.length), ph + 32);
  }
  for (let p = 0x400000; p + 12 <= big.length; p += 12) big.writeUInt32LE(0xfffffffd, p);
  const started = Date.now();
  assert.is(classifyOrRefuse(big), 'refused');
  const ms = Date.now() - started;
  assert.ok(ms < 2000, `classification took ${ms} ms`);
});

test('a directory or a FIFO given as the kernel is refused, without waiting', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-kernel-test-'));
  try {
    const err = await inspectKernel(dir).catch((e: unknown) => e);
    assert.is((err as TorporError).code, 'KERNEL_INVALID');
    assert.match((err as Error).message, /not a regular file/);
    const fifo = join(dir, 'fifo');
    execFileSync('mkfifo', [fifo]);
    const ferr = await inspectKernel(fifo).catch((e: unknown) => e);
    assert.is((ferr as TorporError).code, 'KERNEL_INVALID');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('keys follow every input: another kernel source tarball, or other apt sources files, are other artifacts', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-kernel-key-'));
  const saved = { tarball: process.env.LINUX_SOURCE_TARBALL, sources: process.env.APT_SOURCES };
  try {
    const keyOf = async () => {
      const spec = await builtKernelSpec();
      return artifactKey(spec.kind, spec.inputs);
    };
    delete process.env.LINUX_SOURCE_TARBALL;
    const usual = await keyOf();
    const tarball = join(dir, 'linux.tar.xz');
    await writeFile(tarball, 'one');
    process.env.LINUX_SOURCE_TARBALL = tarball;
    const other = await keyOf();
    assert.is.not(other, usual);
    await writeFile(tarball, 'two, longer');
    assert.is.not(await keyOf(), other, 'a changed tarball is a changed kernel');

    const sources = join(dir, 'my.sources');
    await writeFile(sources, 'Types: deb\nURIs: http://one.invalid/debian\n');
    process.env.APT_SOURCES = sources;
    const a = artifactKey('rootfs-base', await baseInputs());
    await writeFile(sources, 'Types: deb\nURIs: http://two.invalid/debian\n');
    assert.is.not(artifactKey('rootfs-base', await baseInputs()), a, 'the sources files\' contents are in the key');
  } finally {
    if (saved.tarball === undefined) delete process.env.LINUX_SOURCE_TARBALL;
    else process.env.LINUX_SOURCE_TARBALL = saved.tarball;
    if (saved.sources === undefined) delete process.env.APT_SOURCES;
    else process.env.APT_SOURCES = saved.sources;
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

testUnless('kernel', toolsError(['kernel'])?.message ?? null, 'tools')('our kernel: a vmlinux with the PVH entry note, built from the verified config', async () => {
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
