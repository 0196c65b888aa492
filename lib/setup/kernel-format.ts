// Recognizes the kernel formats torpor's VMM can load (see docs/platform.md):
//   - vmlinux ELF64 x86-64 with a XEN_ELFNOTE_PHYS32_ENTRY note (PVH entry),
//   - vmlinux ELF64 x86-64 without it (64-bit boot protocol at the ELF entry),
//   - bzImage with boot protocol >= 2.12 and XLF_KERNEL_64.
// Anything else is refused with KERNEL_INVALID before a machine tries to boot it.
import { open } from 'node:fs/promises';

import { TorporError } from '../errors.js';

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

/** Finds the PVH entry (XEN_ELFNOTE_PHYS32_ENTRY) in the PT_NOTE segments. */
function findPvhEntry(buf: Buffer, segs: Segment[]): number | undefined {
  for (const seg of segs) {
    if (seg.type !== PT_NOTE) continue;
    const end = Math.min(seg.offset + seg.filesz, buf.length);
    let p = seg.offset;
    while (p + 12 <= end) {
      const namesz = buf.readUInt32LE(p);
      const descsz = buf.readUInt32LE(p + 4);
      const type = buf.readUInt32LE(p + 8);
      const nameStart = p + 12;
      const descStart = nameStart + ((namesz + 3) & ~3);
      const next = descStart + ((descsz + 3) & ~3);
      if (next > end || next <= p) break;
      const name = buf.toString('latin1', nameStart, nameStart + Math.max(0, namesz - 1));
      if (name === 'Xen' && type === XEN_ELFNOTE_PHYS32_ENTRY && descsz >= 4) {
        return descsz >= 8 ? Number(buf.readBigUInt64LE(descStart)) : buf.readUInt32LE(descStart);
      }
      p = next;
    }
  }
  return undefined;
}

/** Classifies a kernel image from its bytes. `path` is used in messages only. */
export function classifyKernel(buf: Buffer, size: number, path = 'kernel'): KernelInfo {
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
      return { format: 'elf-pvh', size, entry: pvh };
    }
    if (elfClass !== 2) throw invalid(path, `an ELF file of unknown class ${elfClass}`);
    if (machine !== EM_X86_64) throw invalid(path, `an ELF file for machine ${machine}, not x86-64`);
    const segs = segments(buf, true);
    const pvh = findPvhEntry(buf, segs);
    if (pvh !== undefined) return { format: 'elf-pvh', size, entry: pvh };
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

/** Reads and classifies a kernel file; KERNEL_INVALID when it is not one we can boot. */
export async function inspectKernel(path: string): Promise<KernelInfo> {
  let fh;
  try {
    fh = await open(path, 'r');
  } catch (err) {
    throw new TorporError('KERNEL_INVALID', `cannot read kernel ${path}: ${(err as Error).message}`, { cause: err });
  }
  try {
    const { size } = await fh.stat();
    if (size === 0) throw invalid(path, 'the file is empty');
    if (size > READ_LIMIT) throw invalid(path, `${size} bytes, larger than any kernel image`);
    const len = Math.min(size, READ_LIMIT);
    const buf = Buffer.alloc(len);
    await fh.read(buf, 0, len, 0);
    return classifyKernel(buf, size, path);
  } finally {
    await fh.close();
  }
}
