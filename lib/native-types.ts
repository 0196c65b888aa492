// The raw binding of the native addon (native/addon), typed in one place.
// (Formerly lib/native.d.ts: a .d.ts beside lib/native.ts is shadowed by it, so
// TypeScript never saw these types.)
// lib/native.ts loads it; everything else in lib/ wraps it in idiomatic classes.

/** What KVM this host has: 'hardware' (VMX/SVM) or 'pvm' (the PVM module, which runs guests inside a cloud VM without nested virtualization; a Linux guest needs a PVM-enabled kernel there). */
export type HostKind = 'hardware' | 'pvm';

/** What {@link probeHost} found out about the KVM device. */
export interface HostProbe {
  /** Path of the KVM device that was opened. */
  device: string;
  /** KVM_GET_API_VERSION (12 on every current kernel). */
  apiVersion: number;
  /** Hardware virtualization or PVM. */
  hostKind: HostKind;
  /** CPU vendor string from CPUID leaf 0 of the host. */
  cpuVendor: string;
  /** Capability name -> present. Names: irqchip, pit2, userMemory, dirtyLog, manualDirtyLogProtect,
   *  immediateExit, xsave, xcrs, kvmclockCtrl, preFaultMemory, ioeventfd, irqfd, tscControl, xsave2,
   *  setIdentityMapAddr, maxVcpus (number in capabilityValues). */
  capabilities: Record<string, boolean>;
  /** Numeric capabilities (KVM_CHECK_EXTENSION results), e.g. maxVcpus, nrMemslots, xsave2Size. */
  capabilityValues: Record<string, number>;
  /** Capabilities torpor requires that this host lacks (empty when usable). */
  missing: string[];
}

export interface NativeDiskConfig {
  /** Read-only base image (ext4 for Linux guests); may be '' for an overlay-only disk. */
  base: string;
  /** Copy-on-write overlay data file (format: docs/overlay.md); created if missing. */
  overlay: string;
  /** Overlays frozen by snapshot generations, oldest first, opened read-only under `overlay`. */
  frozen?: string[];
  /** Bytes, when larger than the layers (a grown disk); absent: the largest layer's. */
  sizeBytes?: number;
  readOnly?: boolean;
  serial?: string;
}

export interface NativeMachineConfig {
  kernel: string;
  initrd?: string;
  cmdline: string;
  vcpus: number;
  memoryMiB: number;
  disks: NativeDiskConfig[];
  /** Guest CID; omit for no vsock device. */
  vsockCid?: number;
  /** Host ports (1..1023, at most 16) on which a guest-initiated connection request is a knock:
   *  counted, answered RST, reported as a 'vsockKnock' event (docs/protocol.md). Not saved in snapshots. */
  vsockKnockPorts?: number[];
  rng?: boolean;
  /** virtio-net: the MAC, and the backend's Unix socket (QEMU stream protocol: passt) to connect now. */
  net?: { mac: string; backendSocket?: string };
  /** Append everything the guest prints on the serial port to this file. */
  consoleLog?: string;
  /** Bytes of console output kept in memory (consoleTail); default 64 KiB. */
  consoleRingBytes?: number;
  /** /dev/kvm by default. */
  kvmDevice?: string;
}

/** A machine's state: 'created' (built, not started), 'running', 'pausing', 'paused', 'stopped' (stop(), or the guest powered off or reset), 'failed' (a panic, a fault, or the VMM failed: the exit reason says). */
export type NativeMachineState = 'created' | 'running' | 'pausing' | 'paused' | 'stopped' | 'failed';

/** Why a machine ended. */
export interface NativeExitReason {
  /** 'reset' (the guest reset the machine through the i8042), 'poweroff' and 'panic' (KVM system
   *  events), 'stop' (the host stopped it), 'triple-fault', 'internal-error' (KVM or the VMM failed),
   *  'emulation-failure', 'seccomp-violation' (a vCPU or I/O thread made a system call outside its
   *  seccomp allow-list, docs/seccomp.md: that machine fails, the process goes on). 'hlt' only where KVM hands HLT to us, i.e. never with our in-kernel irqchip: a
   *  guest halted for good with interrupts off stays halted inside KVM until stop(). */
  kind: string;
  /** The same, in words, with the detail there is (a panic's line, a KVM error). */
  message: string;
  /** The last console output (up to 4 KiB) at the moment the machine ended. */
  consoleTail: string;
}

export type NativeMachineEvent =
  | { type: 'console'; data: Buffer }
  | { type: 'exit'; state: 'stopped' | 'failed'; reason: NativeExitReason }
  /** The guest knocked on a knock port; `count`: knocks on it so far (several knocks may share one event). */
  | { type: 'vsockKnock'; port: number; count: number };

/** A machine's counters (Machine.stats()): diagnostics and benchmarks. */
export interface NativeMachineStats {
  /** VM exits handled in user space so far, all kinds. */
  exits: number;
  /** Of those, port I/O exits. */
  pioExits: number;
  /** Of those, MMIO exits. */
  mmioExits: number;
  /** Of those, HLT exits (none with the in-kernel irqchip). */
  haltExits: number;
  /** Nanoseconds from construction to the first KVM_RUN entering the guest. */
  createToFirstRunNs: number;
  /** Nanoseconds from construction to the first PIO/MMIO exit (the guest's first instructions ran). */
  createToFirstExitNs: number;
  /** The first PIO/MMIO exit on CLOCK_MONOTONIC, comparable with process.hrtime.bigint(); 0n: none yet. */
  firstExitAtNs: bigint;
  /** Where construction (create, or restore from the restore call on) spent its time, phase by phase (ms). */
  buildPhasesMs: Record<string, number>;
  /** The vsock device's counters, when the machine has one (it is running or paused). */
  vsock?: NativeVsockStats;
}

/** The virtio-vsock device's counters. */
export interface NativeVsockStats {
  /** Packets sent to the guest. */
  txPackets: number;
  /** Packets received from the guest. */
  rxPackets: number;
  /** Packets dropped (malformed, or for no connection); `lastDrop` says why the last one was. */
  dropped: number;
  /** Resets sent to the guest (connections refused or torn down). */
  rstSent: number;
  /** Connections established, and those in the table now. */
  connections: number;
  /** Connections in the table now. */
  live: number;
  /** Transport-reset events delivered (one per restore). */
  events: number;
  /** Knocks the guest made on the knock ports. */
  knocks: number;
  /** Host connection requests held after a transport reset until the guest re-posted its event buffer
   *  (native/devices/virtio/vsock/README.md). */
  heldRequests: number;
  /** Why the last packet was dropped ('' : none was). */
  lastDrop: string;
}

/** Where a generation's files are, relative to its snapshot directory. */
export interface NativeGenerationLayout {
  dir: string;
  state: string;
  memoryLayer: string;
  manifest: string;
  /** Disk i's top layer as the generation froze it (when the disk had a writable top). */
  diskOverlays: string[];
}

/** What a capture wrote (Machine.snapshot). */
export interface NativeSnapshotResult {
  /** The generation's number (1, 2, ... in its snapshot directory). */
  generation: number;
  /** Bytes written: memory layer, state file, manifest. */
  bytes: number;
  /** Pages in the memory layer: written since the previous generation (diff), or RAM's nonzero pages (full). */
  dirtyPages: number;
  /** True when the memory layer is a full image (first capture into the directory). */
  fullLayer: boolean;
  /**
   * Per disk, the frozen layers this generation names, oldest first: relative to the snapshot
   * directory when inside it, else absolute (a template's). Own layers are merged off the capture
   * path, so this list stays short however many generations there were.
   */
  diskLayers: string[][];
  /** The generation's state file, memory layer and manifest.json, relative to the snapshot
   *  directory (the addon names them: native/snapshot/generation_layout.h). */
  stateFile: string;
  /** The generation's memory layer, relative to the snapshot directory. */
  memoryLayer: string;
  /** The generation's manifest.json, relative to the snapshot directory. */
  manifest: string;
  /** The memory chain this generation restores from, bottom first (its own layer last):
   *  relative to the snapshot directory, or absolute (another directory's layers). */
  memoryLayers: string[];
  /** State and dirty pages read: the machine could continue from here. */
  capturedMs: number;
  /** The generation is on disk (fsynced) and `current` points at it. */
  durableMs: number;
}

export interface NativeMachine {
  /**
   * Starts the vCPU threads and the I/O thread. Resolves once every vCPU entered KVM_RUN once,
   * or, with paused = true, once every vCPU is parked and the devices are quiesced (state 'paused').
   */
  start(paused?: boolean): Promise<void>;
  /**
   * Pauses (if running), then writes a generation into dir on a worker thread. The machine
   * stays paused, or with resumeWhenCaptured runs again once its state and memory are copied
   * out (capturedMs), while the generation is made durable. Rejects with INVALID_STATE unless running or paused, IO_ERROR on a write failure.
   */
  snapshot(dir: string, resumeWhenCaptured?: boolean): Promise<NativeSnapshotResult>;
  /** Pauses (bounded by timeoutMs, default 2000) and captures a generation into dir on the calling
   *  thread; returns its number. For the process's end only ('exit' handlers). */
  captureNow(dir: string, timeoutMs?: number): number;
  /** Where the env cleanup hook captures the machine (as captureNow) if it still runs when its
   *  environment ends (a worker thread ending); null: no capture (the default). */
  setTeardownCapture(dir: string | null, timeoutMs?: number): void;
  /** Pages written since the last generation (guest and devices). Reads KVM's dirty log; loses nothing. */
  dirtyPageCount(): number;
  /** `count` restores of this machine's snapshots are coming (fork): VM shells are built ahead for them. */
  prepareRestores(count: number): void;
  /** The same pages as a bitmap (bit i of byte i/8: RAM's linear page i, slot 0 then slot 1). */
  dirtyPageBitmap(): Buffer;
  /** The state a capture would save, by part (vm.pit, vcpu0.regs, vcpu0.msr.0x10, dev.<name>@<base>...). Paused only. */
  stateParts(): Record<string, Buffer>;
  /** Resolves when every vCPU is out of KVM_RUN with its pending I/O completed. */
  pause(): Promise<void>;
  resume(): Promise<void>;
  /** Stops the machine (vCPUs and I/O thread joined); resolves to the exit reason. Idempotent. */
  stop(): Promise<NativeExitReason>;
  state(): NativeMachineState;
  exitReason(): NativeExitReason | null;
  /** Serial input (to the 8250's receive FIFO); returns the bytes it took (the FIFO is bounded). */
  consoleWrite(data: Buffer | string): number;
  /** The last bytes the guest printed (bounded ring). */
  consoleTail(): Buffer;
  /** Host-initiated vsock stream; resolves to the host end of a socketpair (wrap it in net.Socket). */
  vsockConnect(port: number, timeoutMs?: number): Promise<number>;
  /** Sends a vsock transport-reset event to the guest, dropping every connection. */
  vsockReset(): void;
  /** Knocks counted on a knock port since the machine was built (latched; 0 for any other port). */
  vsockKnocks(port: number): number;
  /** A restored machine's knock ports (a snapshot keeps none); state 'created' only (before start). */
  setVsockKnockPorts(ports: number[]): void;
  /** Connects the network device to a backend's Unix socket, replacing the one before (NET_BACKEND on failure). */
  netAttach(socketPath: string): void;
  /** The same over a new socketpair; returns the other end's fd (the caller closes it once handed on). */
  netAttachPair(): number;
  /** Attaches the network device to `fd` (a connected stream socket); the machine owns it from here. */
  netAttachFd(fd: number): void;
  /** What the guest may send (egress off: ARP/NDP/DHCP, replies from guestPorts, packets to allowIpv4). */
  netEgressPolicy(policy: { egress: boolean; guestPorts?: number[]; allowIpv4?: string[] }): void;
  /** Why the network backend's socket died; '' while it lives. */
  netBackendError(): string;
  /** Bounds-checked read of guest-physical memory (tests, debugging). Throws GUEST_MEMORY out of range. */
  readGuest(gpa: number, length: number): Buffer;
  stats(): NativeMachineStats;
  /** The kernel command line as loaded (the caller's plus the virtio_mmio.device= entries). */
  kernelCmdline(): string;
}

export interface NativeBinding {
  /** Hands native code the factory it uses to build every error it throws. Called once at load. */
  setErrorFactory(factory: (code: string, message: string, errno?: number) => Error): void;
  /** Opens the KVM device and reports what it can do. Throws KVM_UNAVAILABLE with the reason. */
  probe(devicePath?: string): HostProbe;
  Machine: new (config: NativeMachineConfig, onEvent: (event: NativeMachineEvent) => void) => NativeMachine;
  /**
   * Rebuilds a machine from the generation `current` names in dir, on a worker thread.
   * Resolves to a machine in state 'created' (start() it). SNAPSHOT_INVALID for a corrupt or
   * truncated snapshot, SNAPSHOT_INCOMPATIBLE for another host kind or CPU; no guest runs then.
   */
  restoreMachine(dir: string, onEvent: (event: NativeMachineEvent) => void, into?: string, diskBytes?: number[]): Promise<NativeMachine>;
  /** What `new Machine(config, onEvent)` does (VM, RAM, devices, kernel load), on a worker thread. */
  buildMachine(config: NativeMachineConfig, onEvent: (event: NativeMachineEvent) => void): Promise<NativeMachine>;
  /** The state saved in dir's current generation, by part (as NativeMachine.stateParts names them). Reads one small file. */
  describeSnapshot(dir: string): Record<string, Buffer>;
  /** The files of generation `generation` (with `disks` disks), relative to its snapshot directory:
   *  the addon owns the directory's layout (native/snapshot/generation_layout.h). Arguments are
   *  the caller's to check (numbers: an integer >= 1, a disk count). */
  snapshotLayout(generation: number, disks: number): NativeGenerationLayout;
  /** VM shells kept for restores (native/vmm/vm_pool.h): sets the depth when given (0..16, 0 = off). */
  restorePool(depth?: number): { depth: number; idle: number };
  /**
   * Non-blocking exclusive flock(2) on path (created 0644 if missing), through an O_CLOEXEC fd this
   * process holds; the holder's pid is written into the file. `{ fd }` when taken, else the pid read
   * from the file (null when unreadable). PERMISSION_DENIED / IO_ERROR (with errno) otherwise.
   */
  tryLockFile(path: string): { fd: number } | { ownerPid: number | null };
  /** Closes an fd tryLockFile returned, releasing its lock. INVALID_ARGUMENT for any other fd. */
  closeLockFile(fd: number): void;
  /**
   * Replaces `path` durably in one round on the thread pool: `text` into `tmp` (beside it), fsync,
   * rename, fsync of the directory. PERMISSION_DENIED / OUT_OF_SPACE / IO_ERROR (with errno): before
   * the rename with the temporary removed and `path` as it was, after it (the directory's fsync)
   * with the new file in place.
   */
  replaceFileDurably(tmp: string, path: string, text: string): Promise<void>;
  /** KVM ioctls this process made so far, KVM_RUN aside (benchmarks: KVM calls per path). */
  kvmCallCount(): number;
  /** A connected pair of Unix stream sockets (CLOEXEC fds): one for netAttachFd, one for the backend process. */
  netSocketPair(): [number, number];
  /** Closes an fd netSocketPair handed out that no machine took (INVALID_ARGUMENT for any other fd). */
  closeNetSocket(fd: number): void;
  /** Build facts: addon version, compiler, whether built with sanitizers. */
  buildInfo(): { version: string; compiler: string };
}
