// Recognizes the kernel formats torpor's VMM can load (see docs/platform.md):
//   - vmlinux ELF64 x86-64 with a XEN_ELFNOTE_PHYS32_ENTRY note (PVH entry),
//   - vmlinux ELF64 x86-64 without it (64-bit boot protocol at the ELF entry),
//   - bzImage with boot protocol >= 2.12 and XLF_KERNEL_64.
// Anything else is refused with KERNEL_INVALID before a machine tries to boot it.
import { type Stats, constants } from 'node:fs';
import { open, stat } from 'node:fs/promises';

import { TorporError } from '../errors.js';

/** A guest kernel's format: vmlinux with a PVH entry note, vmlinux without it (64-bit boot protocol), or a bzImage (docs/platform.md). */
export type KernelFormat = 'elf-pvh' | 'elf-64' | 'bzimage';

export interface KernelInfo {
  format: KernelFormat;
  size: number;
  /** ELF entry point (elf-64) or PVH 32-bit entry (elf-pvh). */
  entry?: number;
  /** bzImage boot protocol version, e.g. 0x20f. */
  protocol?: number;
}

const XEN_ELFNOTE_PHYS32_ENTRY = 18;
const PT_LOAD = 1;
const PT_NOTE = 4;
const ET_EXEC = 2;
const EM_386 = 3;
const EM_X86_64 = 62;
const XLF_KERNEL_64 = 1;
const KERNEL_HALF = 0xffff800000000000n;
/** vmlinux keeps its notes after .text, tens of MiB in: read whole files up to this size. */
const READ_LIMIT = 512 << 20;
/** Note bytes scanned in all (a vmlinux has a few hundred): bounds the work a crafted file can cause. */
const NOTE_SCAN_LIMIT = 1 << 20;

function invalid(path: string, why: string): TorporError {
  return new TorporError(
    'KERNEL_INVALID',
    `${path} is not a kernel torpor can boot: ${why}. ` +
      'Supply an x86-64 vmlinux (ELF, ideally built with CONFIG_PVH=y) or a bzImage with the 64-bit boot protocol (>= 2.12).',
  );
}

interface Segment {
  type: number;
  offset: number;
  vaddr: bigint;
  filesz: number;
}

/** Program headers of an ELF image, for either class (bounds-checked against the buffer). */
function segments(buf: Buffer, is64: boolean): Segment[] {
  const phoff = is64 ? Number(buf.readBigUInt64LE(0x20)) : buf.readUInt32LE(0x1c);
  const phentsize = buf.readUInt16LE(is64 ? 0x36 : 0x2a);
  const phnum = buf.readUInt16LE(is64 ? 0x38 : 0x2c);
  const out: Segment[] = [];
  if (phentsize < (is64 ? 56 : 32)) return out;
  for (let i = 0; i < phnum; i++) {
    const ph = phoff + i * phentsize;
    if (ph + phentsize > buf.length) break;
    out.push(
      is64
        ? {
            type: buf.readUInt32LE(ph),
            offset: Number(buf.readBigUInt64LE(ph + 8)),
            vaddr: buf.readBigUInt64LE(ph + 16),
            filesz: Number(buf.readBigUInt64LE(ph + 32)),
          }
        : {
            type: buf.readUInt32LE(ph),
            offset: buf.readUInt32LE(ph + 4),
            vaddr: BigInt(buf.readUInt32LE(ph + 8)),
            filesz: buf.readUInt32LE(ph + 16),
          },
    );
  }
  return out;
}

/** Rounds a note field's size up to 4 bytes, in plain arithmetic (`& ~3` would wrap sizes >= 2^31). */
function align4(n: number): number {
  return Math.ceil(n / 4) * 4;
}

/**
 * Finds the PVH entry (XEN_ELFNOTE_PHYS32_ENTRY) in the PT_NOTE segments.
 * Every size comes from the file: each note must lie wholly inside its segment
 * and the buffer, and names are compared over their first bytes only, so a
 * crafted note can neither read out of bounds nor cost more than a few
 * operations per 12 bytes of segment.
 */
function findPvhEntry(buf: Buffer, segs: Segment[]): number | undefined {
  let budget = NOTE_SCAN_LIMIT;
  for (const seg of segs) {
    if (seg.type !== PT_NOTE || seg.offset >= buf.length || budget <= 0) continue;
    // 65535 PT_NOTE headers over one huge range must not cost 65535 scans of it.
    const end = Math.min(seg.offset + seg.filesz, buf.length, seg.offset + budget);
    budget -= end - seg.offset;
    let p = seg.offset;
    while (p + 12 <= end) {
      const namesz = buf.readUInt32LE(p);
      const descsz = buf.readUInt32LE(p + 4);
      const type = buf.readUInt32LE(p + 8);
      const nameStart = p + 12;
      const descStart = nameStart + align4(namesz);
      const next = descStart + align4(descsz);
      if (next > end) break;
      // "Xen\0": namesz 4. Comparing bytes, not a decoded string of namesz characters.
      const isXen = namesz === 4 && buf.readUInt32BE(nameStart) === 0x58656e00;
      if (isXen && type === XEN_ELFNOTE_PHYS32_ENTRY && descsz >= 4) {
        return descsz >= 8 ? Number(buf.readBigUInt64LE(descStart)) : buf.readUInt32LE(descStart);
      }
      p = next;
    }
  }
  return undefined;
}

/** The PVH entry is where a vCPU starts in 32-bit protected mode, paging off: a physical address below 4 GiB. */
function checkPvhEntry(entry: number, path: string): void {
  if (entry === 0 || entry > 0xffffffff) throw invalid(path, `a PVH entry note pointing at 0x${entry.toString(16)}, not a 32-bit physical address`);
}

/**
 * Classifies a kernel image from its bytes. `path` is used in messages only.
 * The bytes are untrusted: whatever they hold, the answer is a KernelInfo or a
 * KERNEL_INVALID error, never another exception.
 */
export function classifyKernel(buf: Buffer, size: number, path = 'kernel'): KernelInfo {
  try {
    return classifyBytes(buf, size, path);
  } catch (err) {
    if (err instanceof TorporError) throw err;
    // A bounds check this parser missed: still the user's file at fault, still a clear refusal.
    throw invalid(path, `a malformed header (${(err as Error).message})`);
  }
}

function classifyBytes(buf: Buffer, size: number, path: string): KernelInfo {
  if (buf.length >= 4 && buf.readUInt32BE(0) === 0x7f454c46) {
    if (buf.length < 64) throw invalid(path, 'truncated ELF header');
    const elfClass = buf[4];
    if (buf[5] !== 1) throw invalid(path, 'a big-endian ELF file');
    const machine = buf.readUInt16LE(0x12);
    const type = buf.readUInt16LE(0x10);
    if (type !== ET_EXEC) throw invalid(path, 'an ELF file that is not an executable image (a program or library?)');
    if (elfClass === 1) {
      // 32-bit: only a PVH kernel (entered in 32-bit protected mode), e.g. guest/testvm.
      if (machine !== EM_386) throw invalid(path, `a 32-bit ELF file for machine ${machine}`);
      const pvh = findPvhEntry(buf, segments(buf, false));
      if (pvh === undefined) throw invalid(path, 'a 32-bit ELF file without a PVH entry note');
      checkPvhEntry(pvh, path);
      return { format: 'elf-pvh', size, entry: pvh };
    }
    if (elfClass !== 2) throw invalid(path, `an ELF file of unknown class ${elfClass}`);
    if (machine !== EM_X86_64) throw invalid(path, `an ELF file for machine ${machine}, not x86-64`);
    const segs = segments(buf, true);
    const pvh = findPvhEntry(buf, segs);
    if (pvh !== undefined) {
      checkPvhEntry(pvh, path);
      return { format: 'elf-pvh', size, entry: pvh };
    }
    // A Linux vmlinux links its loadable segments in the kernel half of the
    // address space; an ordinary static program never does.
    if (!segs.some((s) => s.type === PT_LOAD && s.vaddr >= KERNEL_HALF)) {
      throw invalid(path, 'an x86-64 ELF executable with no kernel-space segments (a program, not a vmlinux)');
    }
    const entry = Number(buf.readBigUInt64LE(0x18));
    if (entry === 0) throw invalid(path, 'an x86-64 vmlinux without an entry point');
    return { format: 'elf-64', size, entry };
  }
  // bzImage: boot sector signature, then the "HdrS" setup header (Documentation/x86/boot.rst).
  if (buf.length >= 0x240 && buf.readUInt16LE(0x1fe) === 0xaa55 && buf.toString('latin1', 0x202, 0x206) === 'HdrS') {
    const protocol = buf.readUInt16LE(0x206);
    if (protocol < 0x20c) {
      throw invalid(path, `a bzImage with boot protocol ${protocol >> 8}.${protocol & 0xff}, older than 2.12`);
    }
    const xloadflags = buf.readUInt16LE(0x236);
    if ((xloadflags & XLF_KERNEL_64) === 0) throw invalid(path, 'a bzImage without XLF_KERNEL_64 (no 64-bit entry)');
    return { format: 'bzimage', size, protocol };
  }
  if (buf.length >= 6 && buf.toString('latin1', 0, 6) === '\xfd7zXZ\0') throw invalid(path, 'an xz archive');
  throw invalid(path, 'neither an ELF file nor a bzImage');
}

/** KERNEL_INVALID unless the file `st` describes is a regular, non-empty one. */
function checkKernelStat(path: string, st: Stats): void {
  if (!st.isFile()) throw invalid(path, 'not a regular file');
  if (st.size === 0) throw invalid(path, 'the file is empty');
}

/** What a path given as a kernel must be before anything else is asked (Sandbox.create checks it
 *  ahead of the host): there, a regular file, not empty. Its contents: inspectKernel. */
export async function checkKernelFile(path: string): Promise<void> {
  let st;
  try {
    st = await stat(path);
  } catch (err) {
    throw new TorporError('KERNEL_INVALID', `cannot read kernel ${path}: ${(err as Error).message}`, { cause: err });
  }
  checkKernelStat(path, st);
}

/** Reads and classifies a kernel file; KERNEL_INVALID when it is not one we can boot. */
export async function inspectKernel(path: string): Promise<KernelInfo> {
  let fh;
  try {
    // O_NONBLOCK: a FIFO given as the kernel must be refused, not wait forever for a writer.
    fh = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (err) {
    throw new TorporError('KERNEL_INVALID', `cannot read kernel ${path}: ${(err as Error).message}`, { cause: err });
  }
  try {
    const st = await fh.stat();
    checkKernelStat(path, st);
    const size = st.size;
    if (size > READ_LIMIT) {
      throw invalid(path, `${size} bytes, more than the ${READ_LIMIT >> 20} MiB torpor reads (a vmlinux with debug info? strip it: objcopy --strip-debug)`);
    }
    const buf = Buffer.alloc(size);
    let got = 0;
    while (got < size) {
      const { bytesRead } = await fh.read(buf, got, size - got, got);
      if (bytesRead === 0) break; // shrank while we read: classify what is there
      got += bytesRead;
    }
    return classifyKernel(buf.subarray(0, got), size, path);
  } catch (err) {
    if (err instanceof TorporError) throw err;
    throw new TorporError('KERNEL_INVALID', `cannot read kernel ${path}: ${(err as Error).message}`, { cause: err });
  } finally {
    await fh.close();
  }
}
