// A virtual machine hosted in this Node process: the idiomatic layer over the
// native binding (lib/native-types.ts NativeMachine). It validates options,
// serialises lifecycle calls, turns native events into EventEmitter events
// and wraps vsock fds in net.Sockets.
//
// Machines never keep the event loop alive on their own: only a pending
// promise (start, pause, a vsock connect) does.
import { EventEmitter } from 'node:events';
import { mkdtempSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { InvalidArgumentError, TimeoutError, TorporError } from '../errors.js';
import { loadNative } from '../native.js';
import { fail, optionalString, requireInt, requireString } from '../validate.js';
import { pruneSnapshotDir } from '../store/snapshot-files.js';
import type {
  NativeExitReason,
  NativeMachine,
  NativeMachineConfig,
  NativeMachineEvent,
  NativeMachineState,
  NativeMachineStats,
  NativeSnapshotResult,
} from '../native-types.js';

/** One virtio-blk disk of a {@link Machine}: a read-only base, overlays frozen by snapshots, and a copy-on-write top (docs/overlay.md). */
export interface MachineDisk {
  /** Read-only base image ('' or omitted for an overlay-only disk). */
  base?: string;
  /** Copy-on-write overlay data file; created if missing. */
  overlay: string;
  /** Overlays frozen by snapshot generations (oldest first), read-only between the base and the
   *  overlay: the disk as a generation left it, booted afresh (a sandbox's boot from disk). */
  frozen?: string[];
  /** The disk's size in bytes when it is larger than its layers (a sandbox's disk grown beyond
   *  its template's): the overlay takes it, the layers below read as zeros past their ends.
   *  Default: the largest layer's. Smaller than a layer: INVALID_ARGUMENT (never shrinks). */
  sizeBytes?: number;
  /** The guest sees the disk read-only. */
  readOnly?: boolean;
  /** The disk's serial, as the guest reads it (virtio-blk GET_ID, at most 20 bytes). */
  serial?: string;
}

/** What {@link Machine.create} builds: the kernel, the size, the devices. Only `kernel` is required. */
export interface MachineOptions {
  /** Kernel: ELF with a PVH note, ELF64 (64-bit boot protocol) or bzImage. */
  kernel: string;
  /** An initrd (initramfs) to load beside the kernel. */
  initrd?: string;
  /** Kernel command line; the virtio_mmio.device= entries are appended. */
  cmdline?: string;
  /** Default 2. */
  vcpus?: number;
  /** Default 512. */
  memoryMiB?: number;
  /** virtio-blk disks, in order (/dev/vda, /dev/vdb, ...). */
  disks?: MachineDisk[];
  /** Guest CID of a virtio-vsock device (3..0xfffffffe); omit for none. */
  vsockCid?: number;
  /**
   * Host ports (1..1023, at most 16) the guest may knock on: a guest-initiated vsock connection
   * request to one is counted, answered with a reset, and emitted as 'vsockKnock'
   * (vsockKnocks(port) reads the count). The agent knocks once it listens (docs/protocol.md).
   */
  vsockKnockPorts?: number[];
  /** Adds a virtio-rng device. */
  rng?: boolean;
  /**
   * Adds a virtio-net device with this MAC ("52:54:00:xx:xx:xx"; a snapshot keeps it). Its backend is
   * a user-mode network stack speaking QEMU's stream protocol on a Unix socket (passt --socket):
   * `backendSocket` connects it at build time, netAttach() later (a restored machine has none).
   * Without a backend the guest sees the link down.
   */
  net?: {
    /** The guest's MAC address, '52:54:00:xx:xx:xx'. */
    mac: string;
    /** The backend's Unix socket (passt --socket), connected at build time. */
    backendSocket?: string;
  };
  /** Append the guest's serial output to this file. */
  consoleLog?: string;
  /** Bytes of console output kept for consoleTail(); default 64 KiB. */
  consoleRingBytes?: number;
  /** KVM device; default /dev/kvm. */
  kvmDevice?: string;
}

/** A machine's state ({@link NativeMachineState}). */
export type MachineState = NativeMachineState;
/** Why a machine ended ({@link NativeExitReason}). */
export type ExitReason = NativeExitReason;
/** A machine's counters ({@link NativeMachineStats}). */
export type MachineStats = NativeMachineStats;
/** What machine.snapshot() wrote. */
export type SnapshotResult = NativeSnapshotResult;

/** How {@link Machine.snapshot} captures. */
export interface SnapshotOptions {
  /** Stop the machine once the generation is durable (default: it continues as it was). */
  stop?: boolean;
}

/** How {@link Machine.restore} rebuilds a machine from a snapshot directory. */
export interface RestoreOptions {
  /** State of the restored machine: 'running' (default) or 'paused' (resume() it later). */
  state?: 'running' | 'paused';
  /** Knock ports of the restored machine (as MachineOptions.vsockKnockPorts; a snapshot keeps none). */
  vsockKnockPorts?: number[];
  /**
   * Continue in another directory (a sandbox's own, restored from a read-only template): the
   * restored machine's disk top layers go under `into`, nothing is written into `dir`, and the
   * machine's snapshots go on in `into` as if it held its generation 0: the first snapshot(into)
   * writes a diff over `dir`'s memory layers, which its generations name by absolute path.
   */
  into?: string;
  /**
   * Grows the restored machine's disks: per disk, its new size in bytes (a multiple of 512; 0 or
   * absent: as saved). The disk's new top takes the size; the guest's virtio-blk driver gets a
   * config change (the new capacity) when it runs, and the filesystem still has to grow in the
   * guest (the agent's GROW_FS). Smaller than saved, or a read-only disk: INVALID_ARGUMENT.
   */
  diskBytes?: number[];
}

export interface MachineEvents {
  console: [data: Buffer];
  exit: [state: 'stopped' | 'failed', reason: ExitReason];
  /** The guest knocked on a knock port; `count`: knocks on that port so far (bursts coalesce). */
  vsockKnock: [port: number, count: number];
}

const MAX_VCPUS = 254;
const MAX_MEMORY_MIB = 1024 * 1024;

// The one check of knock ports (the addon and the vsock device only assert them).
function checkKnockPorts(ports: unknown): number[] {
  if (!Array.isArray(ports) || ports.length > 16) fail('vsockKnockPorts', 'an array of at most 16 ports', ports);
  return ports.map((p, i) => requireInt(`vsockKnockPorts[${i}]`, p, 1, 1023));
}

/** Validates options and builds the native config (throws INVALID_ARGUMENT). */
export function toNativeConfig(opts: MachineOptions): NativeMachineConfig {
  if (opts === null || typeof opts !== 'object') fail('machine options', 'an object', opts);
  const cfg: NativeMachineConfig = {
    kernel: requireString('kernel', opts.kernel),
    cmdline: optionalString('cmdline', opts.cmdline ?? '') ?? '',
    vcpus: requireInt('vcpus', opts.vcpus ?? 2, 1, MAX_VCPUS),
    memoryMiB: requireInt('memoryMiB', opts.memoryMiB ?? 512, 2, MAX_MEMORY_MIB),
    disks: [],
  };
  const initrd = optionalString('initrd', opts.initrd);
  if (initrd !== undefined) cfg.initrd = initrd;
  if (opts.disks !== undefined) {
    if (!Array.isArray(opts.disks)) fail('disks', 'an array', opts.disks);
    opts.disks.forEach((d, i) => {
      if (d === null || typeof d !== 'object') fail(`disks[${i}]`, 'an object', d);
      const overlay = requireString(`disks[${i}].overlay`, d.overlay);
      const base = optionalString(`disks[${i}].base`, d.base ?? '') ?? '';
      const disk: NativeMachineConfig['disks'][number] = { base, overlay };
      if (d.frozen !== undefined) {
        if (!Array.isArray(d.frozen) || d.frozen.length > 64) fail(`disks[${i}].frozen`, 'an array of at most 64 paths', d.frozen);
        disk.frozen = d.frozen.map((f, j) => requireString(`disks[${i}].frozen[${j}]`, f));
      }
      if (d.sizeBytes !== undefined) {
        disk.sizeBytes = requireInt(`disks[${i}].sizeBytes`, d.sizeBytes, 0, 2 ** 50);
        if (disk.sizeBytes % 512) fail(`disks[${i}].sizeBytes`, 'a multiple of 512', disk.sizeBytes);
      }
      if (d.readOnly !== undefined) disk.readOnly = Boolean(d.readOnly);
      if (d.serial !== undefined) {
        // The one check of a disk serial (the addon's blk factory only asserts it).
        optionalString(`disks[${i}].serial`, d.serial);
        if (Buffer.byteLength(d.serial) > 20) fail(`disks[${i}].serial`, 'a string of at most 20 bytes', d.serial);
        disk.serial = d.serial;
      }
      cfg.disks.push(disk);
    });
  }
  // The one check of the vsock CID: 0-2 are the hypervisor's, local and the host's, 0xffffffff is
  // VMADDR_CID_ANY (the addon and the vsock device only assert the range).
  if (opts.vsockCid !== undefined) cfg.vsockCid = requireInt('vsockCid', opts.vsockCid, 3, 0xfffffffe);
  if (opts.vsockKnockPorts !== undefined) {
    if (cfg.vsockCid === undefined) fail('vsockKnockPorts', 'given with a vsock device (vsockCid)', opts.vsockKnockPorts);
    cfg.vsockKnockPorts = checkKnockPorts(opts.vsockKnockPorts);
  }
  if (opts.rng !== undefined) cfg.rng = Boolean(opts.rng);
  if (opts.net !== undefined) {
    if (opts.net === null || typeof opts.net !== 'object') fail('net', 'an object', opts.net);
    const mac = requireString('net.mac', opts.net.mac);
    if (!/^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$/.test(mac) || (parseInt(mac.slice(0, 2), 16) & 1) !== 0)
      fail('net.mac', 'a unicast MAC like 52:54:00:12:34:56', mac);
    cfg.net = { mac };
    const sock = optionalString('net.backendSocket', opts.net.backendSocket);
    if (sock) cfg.net.backendSocket = sock;
  }
  const log = optionalString('consoleLog', opts.consoleLog);
  if (log !== undefined) cfg.consoleLog = log;
  if (opts.consoleRingBytes !== undefined)
    cfg.consoleRingBytes = requireInt('consoleRingBytes', opts.consoleRingBytes, 1, 64 * 1024 * 1024);
  const dev = optionalString('kvmDevice', opts.kvmDevice);
  if (dev !== undefined) cfg.kvmDevice = dev;
  if (cfg.disks.length + (cfg.vsockCid !== undefined ? 1 : 0) + (cfg.rng ? 1 : 0) + (cfg.net ? 1 : 0) > 19)
    throw new InvalidArgumentError('at most 19 virtio devices (disks + vsock + rng + net)');
  return cfg;
}

/**
 * The microVM itself, over the native addon: build or restore, start, pause, snapshot, stop. The
 * level below {@link Sandbox} (no agent, no store); for tools and tests that drive a guest
 * directly. Events: 'console' (serial output), 'exit' (state and reason), 'vsockKnock'.
 * Errors: INVALID_ARGUMENT, KVM_UNAVAILABLE, BOOT_FAILED, GUEST_MEMORY, INVALID_STATE,
 * SNAPSHOT_INVALID, SNAPSHOT_INCOMPATIBLE, IO_ERROR, MACHINE_FAILED.
 */
export class Machine extends EventEmitter<MachineEvents> {
  readonly #native: NativeMachine;
  // Lifecycle calls run one after another, in call order.
  #queue: Promise<unknown> = Promise.resolve();
  #exit: { state: 'stopped' | 'failed'; reason: ExitReason } | undefined;
  // Where the last generation was written or read: fork() captures a diff there.
  #snapshotDir: string | undefined;
  // Console text seen so far, for waitForConsole (bounded).
  #seen = '';
  static readonly #SEEN_MAX = 1 << 20;

  private constructor(opts: MachineOptions | { restore: (onEvent: (ev: NativeMachineEvent) => void) => NativeMachine }) {
    super();
    const onEvent = (ev: NativeMachineEvent) => this.#onEvent(ev);
    if ('restore' in opts) {
      this.#native = opts.restore(onEvent);
    } else {
      const cfg = toNativeConfig(opts);
      this.#native = new (loadNative().Machine)(cfg, onEvent);
    }
  }

  /**
   * Builds the machine (VM, RAM, devices, vCPUs; kernel loaded). Nothing runs until start().
   * Synchronous: the JS thread waits for KVM and the kernel file (about a millisecond for a small
   * guest, a few ms for a 20 MB vmlinux); build() does the same work on a worker thread.
   */
  static create(opts: MachineOptions): Machine {
    return new Machine(opts);
  }

  /** create() on a worker thread: the JS thread never waits on KVM or on the kernel file. */
  static async build(opts: MachineOptions): Promise<Machine> {
    const cfg = toNativeConfig(opts);
    let onEvent: ((ev: NativeMachineEvent) => void) | undefined;
    const native = await loadNative().buildMachine(cfg, (ev) => onEvent?.(ev));
    return new Machine({
      restore: (handler) => {
        onEvent = handler;
        return native;
      },
    });
  }

  /**
   * Restores the machine whose latest generation is in `dir` (written by snapshot(), in this
   * process or another). The snapshot is validated before any guest runs: SNAPSHOT_INVALID for a
   * corrupt, truncated or unknown-version file, SNAPSHOT_INCOMPATIBLE when it was taken on another
   * host kind or CPU. Rebuilding and loading run on a worker thread. Resolves to a machine in
   * state 'running' (default) or 'paused'. Its vsock connections are reset: reconnect.
   */
  static async restore(dir: string, opts: RestoreOptions = {}): Promise<Machine> {
    requireString('dir', dir);
    const want = opts.state ?? 'running';
    if (want !== 'running' && want !== 'paused') fail('state', "'running' or 'paused'", want);
    const knockPorts = opts.vsockKnockPorts === undefined ? undefined : checkKnockPorts(opts.vsockKnockPorts);
    const into = optionalString('into', opts.into);
    let diskBytes: number[] | undefined;
    if (opts.diskBytes !== undefined) {
      if (!Array.isArray(opts.diskBytes) || opts.diskBytes.length > 16) fail('diskBytes', 'an array of at most 16 sizes', opts.diskBytes);
      diskBytes = opts.diskBytes.map((b, i) => requireInt(`diskBytes[${i}]`, b, 0, 2 ** 50));
    }
    let onEvent: ((ev: NativeMachineEvent) => void) | undefined;
    const native = await loadNative().restoreMachine(dir, (ev) => onEvent?.(ev), into, diskBytes);
    const m = new Machine({
      restore: (handler) => {
        onEvent = handler;
        return native;
      },
    });
    m.#snapshotDir = into ?? dir;
    if (knockPorts) m.#native.setVsockKnockPorts(knockPorts);
    await m.#native.start(want === 'paused');
    return m;
  }

  /**
   * Removes from a snapshot directory the files of older generations that its current generation
   * no longer names: a machine merges its own memory and disk layers off the capture path, so
   * after a while older generations hold only what was merged away; and the disk tops of stopped
   * machines (under tops/; their generations hold hard links). The current generation's
   * directory, anything newer and temporaries stay; `keep` (absolute paths) too. Call it
   * only while no machine of this directory runs (after snapshot(dir, { stop: true }), before the
   * next restore): a running one may be writing a merge into it. Resolves to the files removed.
   */
  static pruneSnapshots(dir: string, keep: readonly string[] = []): Promise<number> {
    requireString('dir', dir);
    return pruneSnapshotDir(dir, keep);
  }

  /**
   * The VM shells kept ready for restores and forks: per RAM size (the two most recently
   * restored), `depth` shells each with the VM, its RAM slots, irqchip and PIT already built
   * off the restore's path (a restore then skips ~3-50 ms of KVM setup on PVM). Built after the
   * first restore of a size; an idle shell holds two fds and no guest memory. Default depth:
   * TORPOR_RESTORE_POOL, else 2; 0 turns the pool off and drops idle shells. Returns the depth
   * and the shells idle now.
   */
  static restorePool(opts: { depth?: number } = {}): {
    /** The depth now in force. */
    depth: number;
    /** Shells built and waiting now. */
    idle: number;
  } {
    if (opts.depth !== undefined) requireInt('depth', opts.depth, 0, 16);
    return loadNative().restorePool(opts.depth);
  }

  /** KVM ioctls this process has made so far, KVM_RUN aside: read before and after a path to count its KVM calls. */
  static kvmCallCount(): number {
    return loadNative().kvmCallCount();
  }

  /**
   * The state saved in `dir`'s current generation, by part (named as stateParts() names them),
   * validated as a restore validates it. Diagnostics and round-trip tests; reads one small file.
   */
  static describeSnapshot(dir: string): Record<string, Buffer> {
    requireString('dir', dir);
    return loadNative().describeSnapshot(dir);
  }

  /**
   * Writes a new generation of this machine into `dir`: the machine pauses (every vCPU out of the
   * guest, devices quiesced), its state and memory (a full layer the first time, then the pages
   * written since) are written on a worker thread, fsynced, and `dir/current` is switched to it
   * atomically. Then the machine continues as it was (running or paused), or stops with
   * `{ stop: true }`. Resolves to what was written, with the captured and durable times.
   * Disks: each writable disk's overlay as it was becomes part of the generation (hard-linked
   * into it, read-only; copied across filesystems) and a new top layer under `dir/tops/` takes
   * the writes: do not reuse the old overlay path for another machine.
   */
  snapshot(dir: string, opts: SnapshotOptions = {}): Promise<SnapshotResult> {
    requireString('dir', dir);
    return this.#serial(async () => {
      // A running machine continues as soon as it is captured, while the generation is written.
      const resume = this.#native.state() === 'running' && !opts.stop;
      const result = await this.#native.snapshot(dir, resume);
      this.#snapshotDir = dir;
      if (opts.stop) await this.#native.stop();
      return result;
    });
  }

  /**
   * snapshot() done synchronously on the calling thread, for a process that is ending (an
   * `exit` handler, where no promise settles any more): the machine pauses (bounded by
   * `timeoutMs`, TIMEOUT when a vCPU does not park in time, nothing written), a generation is
   * written into `dir` and made durable; the machine stays paused. Returns the generation.
   */
  captureNow(dir: string, timeoutMs = 2000): number {
    requireString('dir', dir);
    requireInt('timeoutMs', timeoutMs, 1, 600_000);
    const generation = this.#native.captureNow(dir, timeoutMs);
    this.#snapshotDir = dir;
    return generation;
  }

  /**
   * When this machine's environment ends while it still runs (a worker thread that ends or is
   * terminated: no JS runs there any more), the addon's cleanup hook captures it into `dir` as
   * captureNow() does (bounded by `timeoutMs`, best effort), then stops it. null: no capture
   * (the default). The generation's number is in `dir`'s `current` pointer.
   */
  captureOnTeardown(dir: string | null, timeoutMs = 2000): void {
    if (dir !== null) {
      requireString('dir', dir);
      requireInt('timeoutMs', timeoutMs, 1, 600_000);
    }
    this.#native.setTeardownCapture(dir, timeoutMs);
  }

  /**
   * Forks `count` children from this machine: it pauses briefly while a generation is captured
   * into `dir` (default: the directory of its last snapshot or restore, where only a diff is
   * written; else a new temporary directory, kept: the children's layers live there), then continues; the children restore from that generation, running, sharing its memory
   * image copy-on-write (MAP_PRIVATE of one file) and each writing its disks to a top layer of
   * its own. Parent and children diverge from there.
   */
  async fork(count: number, dir?: string): Promise<Machine[]> {
    requireInt('count', count, 1, 256);
    const where = dir ?? this.#snapshotDir ?? mkdtempSync(join(tmpdir(), 'torpor-fork-'));
    // VM shells for the children are built while the generation is captured (Machine.restorePool).
    this.prepareRestores(count);
    await this.snapshot(where);
    return Promise.all(Array.from({ length: count }, () => Machine.restore(where)));
  }

  /**
   * Builds `count` VM shells of this machine's size ahead, on the pool's thread, for restores
   * about to come (what fork() does while it captures; Sandbox.fork too): each restore then
   * takes one instead of building its VM inline.
   */
  prepareRestores(count: number): void {
    requireInt('count', count, 1, 256);
    this.#native.prepareRestores(count);
  }

  /**
   * The state a capture would save, by named part (vm.pit, vm.clock, vm.irqchip0..2, vcpu<i>.regs,
   * vcpu<i>.lapic, vcpu<i>.msr.0x<index>, dev.<name>@<base>, ...). The machine must be paused.
   * Round-trip tests and diagnostics.
   */
  stateParts(): Record<string, Buffer> {
    return this.#native.stateParts();
  }

  /** Pages written since the last generation (by the guest or the devices). Diagnostics and tests. */
  dirtyPageCount(): number {
    return this.#native.dirtyPageCount();
  }
  /** The same pages as a bitmap: bit i (byte i >> 3, bit i & 7) is RAM's linear page i. */
  dirtyPageBitmap(): Buffer {
    return this.#native.dirtyPageBitmap();
  }

  #onEvent(ev: NativeMachineEvent): void {
    if (ev.type === 'console') {
      this.#seen += ev.data.toString('latin1');
      if (this.#seen.length > Machine.#SEEN_MAX) this.#seen = this.#seen.slice(-Machine.#SEEN_MAX / 2);
      this.emit('console', ev.data);
    } else if (ev.type === 'exit') {
      this.#exit = { state: ev.state, reason: ev.reason };
      this.emit('exit', ev.state, ev.reason);
    } else if (ev.type === 'vsockKnock') {
      this.emit('vsockKnock', ev.port, ev.count);
    }
  }

  #serial<T>(op: () => Promise<T>): Promise<T> {
    const next = this.#queue.then(op, op);
    this.#queue = next.catch(() => undefined);
    return next;
  }

  /** Starts the vCPUs; resolves once every vCPU entered the guest. */
  start(): Promise<void> {
    return this.#serial(async () => {
      await this.#native.start();
      // Test hook: a guest whose vCPUs stop right after they start and never run again, as a
      // guest hung under a test. The nested suite's check that such a test is stopped by its
      // file limit and fails the run, never mistaken for an L1 wedge (docs/nested.md).
      if (process.env.TORPOR_TEST_STOP_VCPUS === '1') {
        await this.#native.pause();
        process.stderr.write('torpor: TORPOR_TEST_STOP_VCPUS=1: this guest\'s vCPUs are stopped for good (a test hook)\n');
      }
    });
  }
  /** Resolves when every vCPU is out of the guest with its pending I/O completed. */
  pause(): Promise<void> {
    return this.#serial(() => this.#native.pause());
  }
  /** Lets a paused machine's vCPUs run again. INVALID_STATE unless it is paused. */
  resume(): Promise<void> {
    return this.#serial(() => this.#native.resume());
  }
  /**
   * Ends the machine and joins its threads; resolves to the exit reason. Idempotent.
   * Releases what the machine holds (guest RAM, devices and their files, KVM fds)
   * now, not at garbage collection: afterwards only state, exitReason,
   * consoleTail, stats and kernelCmdline answer (readGuest, vsock and console
   * input throw INVALID_STATE). A machine the guest ended keeps its memory
   * readable until stop().
   * Not queued behind other calls: a pending start or pause is settled (rejected
   * with INVALID_STATE) by the stop itself.
   */
  stop(): Promise<ExitReason> {
    const stopped = this.#native.stop();
    this.#queue = this.#queue.then(() => stopped, () => stopped).catch(() => undefined);
    return stopped;
  }

  /** Where the machine stands now. */
  get state(): MachineState {
    return this.#native.state();
  }
  /** Why it ended; null while it has not. */
  get exitReason(): ExitReason | null {
    return this.#native.exitReason();
  }
  /** The kernel command line as the guest receives it. */
  get kernelCmdline(): string {
    return this.#native.kernelCmdline();
  }

  /**
   * Sends bytes to the guest's serial port. The UART's receive FIFO is bounded
   * (4 KiB): what it cannot take now is kept here, in order, and fed to it as
   * the guest drains it.
   */
  consoleWrite(data: Buffer | string): void {
    const bytes = typeof data === 'string' ? Buffer.from(data) : data;
    if (bytes.length === 0) return;
    this.#input.push(bytes);
    this.#feedInput();
  }

  #input: Buffer[] = [];
  #inputTimer: NodeJS.Timeout | undefined;

  #feedInput(): void {
    while (this.#input.length) {
      const state = this.#native.state();
      if (state === 'stopped' || state === 'failed') {
        this.#input = [];
        return;
      }
      const head = this.#input[0]!;
      const taken = this.#native.consoleWrite(head);
      if (taken >= head.length) {
        this.#input.shift();
        continue;
      }
      this.#input[0] = head.subarray(taken);
      if (!this.#inputTimer) {
        this.#inputTimer = setTimeout(() => {
          this.#inputTimer = undefined;
          this.#feedInput();
        }, 2);
      }
      return;
    }
  }
  /** The last bytes the guest printed. */
  consoleTail(): Buffer {
    return this.#native.consoleTail();
  }

  /**
   * Resolves once the console output (since creation) matches `pattern`;
   * rejects with TIMEOUT, or with MACHINE_FAILED if the machine ends first.
   */
  waitForConsole(pattern: RegExp | string, timeoutMs = 10_000): Promise<string> {
    const test = (text: string): string | null => {
      if (typeof pattern === 'string') return text.includes(pattern) ? pattern : null;
      const m = pattern.exec(text);
      return m ? m[0] : null;
    };
    const already = test(this.#seen);
    if (already !== null) return Promise.resolve(already);
    return new Promise((resolve, reject) => {
      const cleanup = () => {
        clearTimeout(timer);
        this.off('console', onConsole);
        this.off('exit', onExit);
      };
      const onConsole = () => {
        const m = test(this.#seen);
        if (m !== null) {
          cleanup();
          resolve(m);
        }
      };
      const onExit = (state: string, reason: ExitReason) => {
        const m = test(this.#seen);
        cleanup();
        if (m !== null) resolve(m);
        else
          reject(new TorporError('MACHINE_FAILED', `machine ${state} (${reason.kind}: ${reason.message}) before the console showed ${String(pattern)}`));
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(new TimeoutError(`console did not show ${String(pattern)} within ${timeoutMs} ms; last output: ${JSON.stringify(this.#seen.slice(-200))}`));
      }, timeoutMs);
      this.on('console', onConsole);
      this.on('exit', onExit);
      if (this.#exit) onExit(this.#exit.state, this.#exit.reason);
    });
  }

  /** Opens a vsock stream to the guest's port; resolves to a connected net.Socket. */
  async vsockConnect(port: number, timeoutMs = 5000): Promise<net.Socket> {
    requireInt('port', port, 0, 0xffffffff);
    requireInt('timeoutMs', timeoutMs, 1, 3_600_000);
    const fd = await this.#native.vsockConnect(port, timeoutMs);
    return new net.Socket({ fd, readable: true, writable: true });
  }
  /** Sends a transport reset to the guest: every vsock connection drops. */
  vsockReset(): void {
    this.#native.vsockReset();
  }

  /** Knocks the guest made on a knock port (vsockKnockPorts) since the machine was built; latched. */
  vsockKnocks(port: number): number {
    requireInt('port', port, 0, 0xffffffff);
    return this.#native.vsockKnocks(port);
  }

  /**
   * Connects the network device to a backend's Unix socket (QEMU stream protocol), replacing the
   * one before: a restored machine's network starts here. NET_BACKEND when nothing listens there,
   * INVALID_STATE without a network device.
   */
  netAttach(socketPath: string): void {
    requireString('socketPath', socketPath);
    this.#native.netAttach(socketPath);
  }
  /**
   * Connects the network device to a new socketpair and returns the other end's fd, for a backend
   * process started with it (passt --fd). The caller owns the fd: close it once the child has it.
   */
  netAttachPair(): number {
    return this.#native.netAttachPair();
  }
  /**
   * What the guest may send from now on. `egress: true` (the default): everything. Off: ARP, IPv6
   * neighbour discovery and DHCP, TCP from `guestPorts` (replies of forwarded services) and
   * packets to `allowIpv4`; the device drops the rest before the backend sees it.
   */
  netEgressPolicy(policy: { egress: boolean; guestPorts?: number[]; allowIpv4?: string[] }): void {
    this.#native.netEgressPolicy(policy);
  }
  /** Attaches the network device to `fd` (one end of Machine.netSocketPair()); the machine owns it from here. */
  netAttachFd(fd: number): void {
    requireInt('fd', fd, 0, 0x7fffffff);
    this.#native.netAttachFd(fd);
  }
  /** A connected pair of Unix stream socket fds: one for netAttachFd, one for the backend process (passt --fd). */
  static netSocketPair(): [number, number] {
    return loadNative().netSocketPair();
  }
  /** Closes an end of Machine.netSocketPair() no machine took (closed by the addon: fs.closeSync
   *  would make Node warn in a worker thread about an fd its fs did not open). */
  static closeNetSocket(fd: number): void {
    loadNative().closeNetSocket(fd);
  }
  /** Why the network backend's socket died (it hung up, or broke the protocol); '' while it lives. */
  netBackendError(): string {
    return this.#native.netBackendError();
  }

  /** Bounds-checked read of guest-physical memory (GUEST_MEMORY outside RAM). */
  readGuest(gpa: number, length: number): Buffer {
    requireInt('gpa', gpa, 0, Number.MAX_SAFE_INTEGER);
    requireInt('length', length, 0, 64 * 1024 * 1024);
    return this.#native.readGuest(gpa, length);
  }

  /** The machine's counters now (exits, timings, the vsock device's). */
  stats(): MachineStats {
    return this.#native.stats();
  }

  /** `await using m = Machine.create(...)` stops the machine at the end of the scope. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.stop();
  }
}
