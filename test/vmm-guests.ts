// Tiny guest kernels assembled here, for the VMM tests that need no test VM
// build: each exercises one boot path (PVH ELF32, ELF64 through the 64-bit
// boot protocol, bzImage). Machine code from the assembly shown beside it
// (GNU as, linked at the load address given).
import { accessSync, closeSync, constants, existsSync, mkdtempSync, openSync, readdirSync, readSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { homeLayout } from '../lib/store/home.js';
import { Machine, type MachineOptions } from '../lib/vm/machine.js';
import { bound } from './bounds.js';

/*
 * PVH guest, 32-bit, linked at 0x100000, entered with EBX -> hvm_start_info.
 *   prints "torpor-fixture: hello\n" on COM1;
 *   tags 64 pages: dword at 0x300000 + i*4096 = 0xC0DE0000 + i;
 *   copies the start_info magic (dword at [EBX]) to 0x200004;
 *   then loops: polls LSR; no input -> incl 0x200000 (the counter);
 *   input 'r' -> out 0xfe to port 0x64 (i8042 reset); 't' -> ud2 with the
 *   reset IDT (base 0 over zeroed RAM: no present gate), i.e. a triple fault;
 *   anything else is echoed back.
 */
const PVH_CODE =
  '66baf803be5f0010008a0684c07404ee46ebf6bf00003000b80000dec0890781c700100000403d4000dec075f08b03a3040020' +
  '0066bafd03eca801741066baf803ec3c72740f3c747411eeebe7ff0500002000ebdfb0fee664ebfa0f0bebfc746f72706f722d' +
  '666978747572653a2068656c6c6f0a00';

/*
 * 64-bit guest, linked at 0x1000000, entered in long mode with RSI -> boot_params:
 *   prints "L64", then "+" if boot_params.hdr.header == "HdrS", then "\n";
 *   then resets through the i8042.
 */
const L64_CODE = '66baf803b04ceeb036eeb034ee81be02020000486472537503b02beeb00aeeb0fee664ebfe';

export const PVH_BANNER = 'torpor-fixture: hello';
export const COUNTER_GPA = 0x200000;
export const MAGIC_COPY_GPA = 0x200004;
export const TAG_BASE_GPA = 0x300000;
export const TAG_PAGES = 64;
export const PVH_START_INFO_MAGIC = 0x336ec578;

function u16(b: Buffer, off: number, v: number) { b.writeUInt16LE(v, off); }
function u32(b: Buffer, off: number, v: number) { b.writeUInt32LE(v >>> 0, off); }

/** ELF32 with one PT_LOAD at `addr` and a Xen PVH note (XEN_ELFNOTE_PHYS32_ENTRY = addr). */
export function pvhElf32(code: Buffer = Buffer.from(PVH_CODE, 'hex'), addr = 0x100000): Buffer {
  const ehsize = 52, phsize = 32, phnum = 2;
  const note = Buffer.alloc(20);
  u32(note, 0, 4); // namesz
  u32(note, 4, 4); // descsz
  u32(note, 8, 18); // XEN_ELFNOTE_PHYS32_ENTRY
  note.write('Xen\0', 12, 'latin1');
  u32(note, 16, addr);
  const noteOff = ehsize + phsize * phnum;
  const codeOff = 0x100;
  const file = Buffer.alloc(codeOff + code.length);
  file.write('\x7fELF', 0, 'latin1');
  file[4] = 1; // ELFCLASS32
  file[5] = 1; // little endian
  file[6] = 1;
  u16(file, 16, 2); // ET_EXEC
  u16(file, 18, 3); // EM_386
  u32(file, 20, 1);
  u32(file, 24, addr); // e_entry
  u32(file, 28, ehsize); // e_phoff
  u16(file, 40, ehsize);
  u16(file, 42, phsize);
  u16(file, 44, phnum);
  // PT_LOAD
  let ph = ehsize;
  u32(file, ph, 1);
  u32(file, ph + 4, codeOff);
  u32(file, ph + 8, addr);
  u32(file, ph + 12, addr);
  u32(file, ph + 16, code.length);
  u32(file, ph + 20, code.length + 0x1000); // a little bss
  u32(file, ph + 24, 7);
  u32(file, ph + 28, 0x1000);
  // PT_NOTE
  ph += phsize;
  u32(file, ph, 4);
  u32(file, ph + 4, noteOff);
  u32(file, ph + 16, note.length);
  u32(file, ph + 20, note.length);
  u32(file, ph + 28, 4);
  note.copy(file, noteOff);
  code.copy(file, codeOff);
  return file;
}

/** ELF64 without a PVH note: entered through the 64-bit boot protocol. */
export function elf64(code: Buffer = Buffer.from(L64_CODE, 'hex'), addr = 0x1000000): Buffer {
  const ehsize = 64, phsize = 56;
  const codeOff = 0x100;
  const file = Buffer.alloc(codeOff + code.length);
  file.write('\x7fELF', 0, 'latin1');
  file[4] = 2; // ELFCLASS64
  file[5] = 1;
  file[6] = 1;
  u16(file, 16, 2);
  u16(file, 18, 62); // EM_X86_64
  u32(file, 20, 1);
  file.writeBigUInt64LE(BigInt(addr), 24); // e_entry
  file.writeBigUInt64LE(BigInt(ehsize), 32); // e_phoff
  u16(file, 52, ehsize);
  u16(file, 54, phsize);
  u16(file, 56, 1);
  const ph = ehsize;
  u32(file, ph, 1);
  u32(file, ph + 4, 7);
  file.writeBigUInt64LE(BigInt(codeOff), ph + 8);
  file.writeBigUInt64LE(BigInt(addr), ph + 16);
  file.writeBigUInt64LE(BigInt(addr), ph + 24);
  file.writeBigUInt64LE(BigInt(code.length), ph + 32);
  file.writeBigUInt64LE(BigInt(code.length), ph + 40);
  file.writeBigUInt64LE(0x1000n, ph + 48);
  code.copy(file, codeOff);
  return file;
}

/** A bzImage (boot protocol 2.15, XLF_KERNEL_64) whose 64-bit entry (load + 0x200) runs `code`. */
export function bzImage(code: Buffer = Buffer.from(L64_CODE, 'hex'), opts: { version?: number; xloadflags?: number } = {}): Buffer {
  const setupSects = 1;
  const pmOff = (setupSects + 1) * 512;
  const file = Buffer.alloc(pmOff + 0x200 + code.length);
  file[0x1f1] = setupSects;
  u16(file, 0x1fe, 0xaa55);
  file[0x200] = 0xeb; // jmp over the header: the byte at 0x201 sizes it
  file[0x201] = 0x268 - 0x202;
  file.write('HdrS', 0x202, 'latin1');
  u16(file, 0x206, opts.version ?? 0x020f);
  file[0x211] = 0x01; // LOADED_HIGH
  u32(file, 0x22c, 0x37ffffff); // initrd_addr_max
  u32(file, 0x230, 0x200000); // kernel_alignment
  file[0x234] = 1; // relocatable
  u16(file, 0x236, opts.xloadflags ?? 0x1); // XLF_KERNEL_64
  u32(file, 0x238, 2047); // cmdline_size
  file.writeBigUInt64LE(0x1000000n, 0x258); // pref_address
  u32(file, 0x260, 0x10000); // init_size
  code.copy(file, pmOff + 0x200);
  return file;
}

/** Writes a fixture to a fresh temporary file and returns its path. */
export function writeTemp(name: string, bytes: Buffer): string {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-vmm-'));
  const path = join(dir, name);
  writeFileSync(path, bytes);
  return path;
}

/** guest/testvm's PVH image when it is built (npm test builds it first), else null. */
export function testvmImage(): string | null {
  const path = new URL('../guest/testvm/out/testvm.elf', import.meta.url).pathname;
  return existsSync(path) ? path : null;
}

/** The ELF64 vmlinux `torpor setup` built (or $TORPOR_KERNEL's, when it is one), else null. */
export function builtVmlinux(): string | null {
  const candidates: string[] = [];
  if (process.env.TORPOR_KERNEL) candidates.push(process.env.TORPOR_KERNEL);
  const dir = join(homeLayout().artifacts, 'kernel');
  if (existsSync(dir)) for (const key of readdirSync(dir)) candidates.push(join(dir, key, 'vmlinux'));
  const isElf64 = (path: string) => {
    const head = Buffer.alloc(5);
    const fd = openSync(path, 'r');
    try {
      return readSync(fd, head, 0, 5, 0) === 5 && head.toString('latin1', 0, 4) === '\x7fELF' && head[4] === 2;
    } finally {
      closeSync(fd);
    }
  };
  return candidates.find((path) => existsSync(path) && isElf64(path)) ?? null;
}

/** Why KVM tests cannot run here, or null when /dev/kvm is usable. */
export function kvmSkipReason(): string | null {
  if (!existsSync('/dev/kvm')) return '/dev/kvm does not exist';
  try {
    accessSync('/dev/kvm', constants.R_OK | constants.W_OK);
  } catch {
    return 'no read/write permission on /dev/kvm';
  }
  return null;
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Polls `cond` every 5 ms until it holds; throws naming `what` after `timeoutMs` (scaled by
 * bound() in the nested host). Waiting for what the guest shows, never a fixed sleep: a guest
 * starved of CPU (a loaded host, the emulator) gets there later, not never.
 */
export async function until(cond: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + bound(timeoutMs);
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${bound(timeoutMs)} ms waiting for ${what}`);
    await sleep(5);
  }
}

/** `in al, 0x80; jmp .-2`: one PIO exit per iteration (port 0x80 is unmapped: reads 0xff). */
export const PIO_LOOP = Buffer.from('e480ebfc', 'hex');
/** `mov eax, [0xc0000000]; jmp .-7`: one MMIO exit per iteration (the MMIO hole, unmapped). */
export const MMIO_LOOP = Buffer.from('a1000000c0ebf9', 'hex');

/*
 * SMP guest (PVH, 32-bit, linked at 0x100000): the BSP writes a real-mode
 * trampoline at 0x8000 (ba f8 03 b0 41 ee fa f4 eb fd: mov dx,0x3f8; mov al,'A';
 * out dx,al; cli; hlt; jmp .-1), sends INIT and two SIPIs (vector 0x08) to APIC
 * id 1 through the LAPIC's ICR, prints 'B' and spins. Output "BA" (in either
 * order) proves that vCPU 1 was started by the guest and ran.
 */
export const SMP_CODE = Buffer.from(
  'c70500800000baf803b0c7050480000041eefaf466c70508800000ebfdc7051003e0fe00000001c7050003e0fe00450000' +
    'c7050003e0fe08460000c7050003e0fe0846000066baf803b042eeebfe',
  'hex',
);
/** `int3; jmp .-3`: on PVM the instruction emulator cannot run int3 (emulation failure); on hardware it faults through the empty IDT (triple fault). */
export const INT3_LOOP = Buffer.from('ccebfd', 'hex');


/** Why the test-guest tests cannot run here, or null. */
export function testvmSkipReason(): string | null {
  return kvmSkipReason() ?? (testvmImage() ? null : 'guest/testvm/out/testvm.elf is not built (make -C guest/testvm)');
}

/** Boots guest/testvm and waits for its `boot=ok` line. */
export async function bootTestvm(opts: Partial<MachineOptions> = {}): Promise<Machine> {
  const image = testvmImage();
  if (!image) throw new Error('guest/testvm/out/testvm.elf is not built');
  const m = Machine.create({ kernel: image, vcpus: 1, memoryMiB: 64, ...opts });
  try {
    await m.start();
    await m.waitForConsole(/boot=ok[^\n]*\n/, 10_000);
  } catch (err) {
    await m.stop(); // a machine that never booted is not left running
    throw err;
  }
  return m;
}

/**
 * testvmCommand for long runs: reads the result line from the console events that follow the
 * command, not from the console tail (a ring that stops growing once full, after 64 KiB of output).
 */
export function testvmCommandByEvents(m: Machine, line: string, key: string, timeoutMs = 10_000): Promise<string> {
  return new Promise((resolve, reject) => {
    let seen = '';
    const re = new RegExp(`(?:^|\\n)(${key}=[^\\n]*)\\n`);
    const onConsole = (data: Buffer) => {
      seen = (seen + data.toString('latin1')).slice(-8192);
      const found = re.exec(seen);
      if (found) {
        cleanup();
        resolve(found[1]!);
      }
    };
    const timer = setTimeout(() => {
      cleanup();
      reject(new Error(`no ${key}= line within ${timeoutMs} ms after '${line}'`));
    }, timeoutMs);
    const cleanup = () => {
      clearTimeout(timer);
      m.off('console', onConsole);
    };
    m.on('console', onConsole);
    try {
      m.consoleWrite(`${line}\n`);
    } catch (err) {
      cleanup();
      reject(err);
    }
  });
}

/** Sends a command line to the test guest's serial port and returns its result line (`key=...`). */
export async function testvmCommand(m: Machine, line: string, key: string, timeoutMs = 10_000): Promise<string> {
  const before = m.consoleTail().toString().length;
  m.consoleWrite(`${line}\n`);
  const re = new RegExp(`(?:^|\\n)(${key}=[^\\n]*)\\n`, 'g');
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const text = m.consoleTail().toString();
    re.lastIndex = Math.max(0, before - 1);
    const found = re.exec(text);
    if (found) return found[1]!;
    if (Date.now() > deadline) throw new Error(`no ${key}= line after '${line}'; console: ${text.slice(-300)}`);
    await sleep(5);
  }
}

// Machines do not keep the event loop alive by themselves (docs/architecture.md#threads): the
// timer does while the test waits for the exit event.
export function waitExit(m: Machine, timeoutMs = 10_000): Promise<{ state: string; kind: string; message: string }> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no exit event within ${timeoutMs} ms`)), timeoutMs);
    m.once('exit', (state, r) => {
      clearTimeout(timer);
      resolve({ state, kind: r.kind, message: r.message });
    });
  });
}
