// Kernel loading reads each PT_LOAD segment straight from the file into guest
// RAM and leaves fresh (zero) RAM untouched where the ELF asks for zeros
// (native/vmm/x86_64/kernel_loader.cc), and the initrd likewise. These tests
// read guest memory back and compare it with the files: a multi-segment ELF64
// made here (then booted), an initrd, and the Linux vmlinux `torpor setup`
// built, when present.
import { readFileSync } from 'node:fs';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Machine } from '../lib/vm/machine.js';
import { builtVmlinux, kvmSkipReason, pvhElf32, writeTemp } from './vmm-guests.js';
import { testUnless } from './skip-unless.js';

const kvmTest = testUnless('vmm-kernel-load', kvmSkipReason(), 'kvm');

interface Segment {
  paddr: number;
  data: Buffer;
  memsz: number;
}

/** ELF64 (x86-64, no PVH note: the 64-bit boot protocol) with these PT_LOADs, entered at `entry`. */
function elf64Segments(entry: number, segments: Segment[]): Buffer {
  const ehsize = 64, phsize = 56;
  let offset = 0x1000;
  const placed = segments.map((s) => {
    // File offset congruent to the address modulo the page, as linkers lay them out.
    offset += (s.paddr - offset) & 0xfff;
    const at = offset;
    offset += s.data.length;
    return at;
  });
  const file = Buffer.alloc(offset);
  file.write('\x7fELF', 0, 'latin1');
  file[4] = 2; // ELFCLASS64
  file[5] = 1; // little-endian
  file[6] = 1;
  file.writeUInt16LE(2, 16); // ET_EXEC
  file.writeUInt16LE(62, 18); // EM_X86_64
  file.writeUInt32LE(1, 20);
  file.writeBigUInt64LE(BigInt(entry), 24);
  file.writeBigUInt64LE(BigInt(ehsize), 32);
  file.writeUInt16LE(ehsize, 52);
  file.writeUInt16LE(phsize, 54);
  file.writeUInt16LE(segments.length, 56);
  segments.forEach((s, i) => {
    const ph = ehsize + i * phsize;
    file.writeUInt32LE(1, ph); // PT_LOAD
    file.writeUInt32LE(7, ph + 4);
    file.writeBigUInt64LE(BigInt(placed[i]!), ph + 8);
    file.writeBigUInt64LE(BigInt(s.paddr), ph + 16);
    file.writeBigUInt64LE(BigInt(s.paddr), ph + 24);
    file.writeBigUInt64LE(BigInt(s.data.length), ph + 32);
    file.writeBigUInt64LE(BigInt(s.memsz), ph + 40);
    file.writeBigUInt64LE(0x1000n, ph + 48);
    s.data.copy(file, placed[i]!);
  });
  return file;
}

function pattern(bytes: number, seed: number): Buffer {
  const b = Buffer.alloc(bytes);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < bytes; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    b[i] = x & 0xff;
  }
  return b;
}

// Prints "L64" then a newline on COM1, then resets through the i8042.
const L64_CODE = Buffer.from('66baf803b04ceeb036eeb034eeb00aeeb0fee664ebfe', 'hex');

function waitExit(m: Machine, timeoutMs = 10_000): Promise<string> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no exit within ${timeoutMs} ms`)), timeoutMs);
    m.once('exit', (_state, r) => {
      clearTimeout(timer);
      resolve(r.kind);
    });
  });
}

kvmTest('ELF64 with several segments: file bytes and zero tails land in guest RAM; the guest then runs', async () => {
  const code = Buffer.concat([L64_CODE, pattern(5000, 1)]);
  const data = pattern(3 * 4096 + 123, 2);
  const big = pattern(3 << 20, 3); // spans 2 MiB boundaries
  const segments: Segment[] = [
    { paddr: 0x1000000, data: code, memsz: code.length },
    { paddr: 0x1200123, data, memsz: data.length + 5 * 4096 + 7 }, // unaligned start, zero tail over pages
    { paddr: 0x1a00000, data: big, memsz: big.length },
  ];
  const m = Machine.create({ kernel: writeTemp('segments.elf', elf64Segments(0x1000000, segments)), vcpus: 1, memoryMiB: 64 });
  try {
    for (const s of segments) {
      const got = m.readGuest(s.paddr, s.memsz);
      assert.ok(got.subarray(0, s.data.length).equals(s.data), `segment at 0x${s.paddr.toString(16)}: file bytes`);
      assert.ok(got.subarray(s.data.length).every((b) => b === 0), `segment at 0x${s.paddr.toString(16)}: zero tail`);
    }
    const exited = waitExit(m);
    await m.start();
    await m.waitForConsole('L64\n', 5000);
    assert.is(await exited, 'reset');
  } finally {
    await m.stop();
  }
});

kvmTest('a segment whose zero tail overlaps an earlier segment zeroes it (as the ELF says)', async () => {
  const first = pattern(4 * 4096, 4);
  const segments: Segment[] = [
    { paddr: 0x1000000, data: Buffer.concat([L64_CODE, first]), memsz: L64_CODE.length + first.length },
    { paddr: 0x1002000, data: Buffer.alloc(0x10), memsz: 0x2000 }, // zeros over the first one's bytes 0x2000..0x4000
  ];
  const m = Machine.create({ kernel: writeTemp('overlap.elf', elf64Segments(0x1000000, segments)), vcpus: 1, memoryMiB: 64 });
  try {
    assert.ok(m.readGuest(0x1002000, 0x2000).every((b) => b === 0));
    assert.ok(m.readGuest(0x1000000, 0x2000).equals(segments[0]!.data.subarray(0, 0x2000)));
  } finally {
    await m.stop();
  }
});

kvmTest('initrd: read into guest RAM at the top of low memory, named by the PVH start info', async () => {
  const initrd = pattern((3 << 20) + 123, 5);
  const m = Machine.create({
    kernel: writeTemp('pvh.elf', pvhElf32()),
    initrd: writeTemp('initrd.img', initrd),
    vcpus: 1,
    memoryMiB: 64,
  });
  try {
    // hvm_start_info (at 0x6000: native/vmm/x86_64/layout.h): nr_modules at +12, modlist_paddr at +16.
    const startInfo = m.readGuest(0x6000, 56);
    assert.is(startInfo.readUInt32LE(12), 1);
    const mod = m.readGuest(Number(startInfo.readBigUInt64LE(16)), 32);
    const addr = Number(mod.readBigUInt64LE(0));
    assert.is(Number(mod.readBigUInt64LE(8)), initrd.length);
    assert.is(addr % 4096, 0);
    assert.ok(addr + initrd.length <= 64 << 20);
    assert.ok(m.readGuest(addr, initrd.length).equals(initrd));
  } finally {
    await m.stop();
  }
});

const vmlinux = builtVmlinux();
const linuxTest = testUnless(
  'vmm-kernel-load (vmlinux)',
  kvmSkipReason() ?? (vmlinux ? null : 'no ELF64 guest kernel built (run `torpor setup`, or set TORPOR_KERNEL)'),
  'kvm',
);

linuxTest('the Linux vmlinux: every PT_LOAD segment byte for byte in guest RAM, its bss zero', async () => {
  const file = readFileSync(vmlinux!);
  const m = Machine.create({ kernel: vmlinux!, vcpus: 1, memoryMiB: 256 });
  try {
    const phoff = Number(file.readBigUInt64LE(32));
    const phnum = file.readUInt16LE(56);
    let loads = 0;
    for (let i = 0; i < phnum; i++) {
      const ph = phoff + i * 56;
      if (file.readUInt32LE(ph) !== 1) continue;
      loads++;
      const offset = Number(file.readBigUInt64LE(ph + 8));
      const paddr = Number(file.readBigUInt64LE(ph + 24));
      const filesz = Number(file.readBigUInt64LE(ph + 32));
      const memsz = Number(file.readBigUInt64LE(ph + 40));
      const got = m.readGuest(paddr, memsz);
      assert.ok(got.subarray(0, filesz).equals(file.subarray(offset, offset + filesz)), `PT_LOAD at 0x${paddr.toString(16)}: file bytes`);
      assert.ok(got.subarray(filesz).every((b) => b === 0), `PT_LOAD at 0x${paddr.toString(16)}: bss zero`);
    }
    assert.ok(loads > 0);
  } finally {
    await m.stop();
  }
});

test.run();
