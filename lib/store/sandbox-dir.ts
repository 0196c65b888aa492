// A sandbox's directory under TORPOR_HOME/sandboxes/<id>/ (docs/architecture.md#on-disk-layout):
//
//   meta.json        what the sandbox is (template, kernel, disk, settings) and its last known state
//   owner.lock       the owner lock: held (flock) by the one process that runs the sandbox
//   overlay(.map)    the disk's first top layer (until the first pause freezes it)
//   snapshots/       machine generations (their files named by the addon, lib/store/snapshot-files.ts), the
//                    `current` pointer, tops/ (the running machine's disk top layers)
//   console.log      what the guest printed
//
// meta.json is rewritten whole (temporary file, fsync, rename), so a reader sees the old or the
// new one. It is data on disk like any other: its shape is checked before a field is used.
import { closeSync, fsyncSync, openSync, renameSync, writeSync } from 'node:fs';
import { lstat, mkdir, readdir, readFile, rename, rm, stat, unlink } from 'node:fs/promises';
import { dirname, join } from 'node:path';

import { InvalidArgumentError, SandboxNotFoundError, TorporError } from '../errors.js';
import type { ResolvedNetwork } from '../net/options.js';
import { homeLayout, torporHome } from './home.js';
import { fsyncPath, replaceFileDurably, tempBeside } from './fsync.js';
import { currentGenerationOf } from './snapshot-files.js';
import { frozenDiskTop, generationDiskLayers, metaPathIn } from './generations.js';
import { processAlive } from './process-alive.js';
import { isSandboxState, type SandboxState } from './sandbox-state.js';
import { randomHex } from '../random.js';

/** What a sandbox's lifecycle timeout does: pause it (it then costs disk only) or kill it. */
export type OnTimeout = 'pause' | 'kill';
/** What a resume continued from: the guest's memory (it went on), or the generation's disk (booted). */
export type ResumedFrom = 'memory' | 'disk';
/** How a sandbox's machine first came up: restored from a warm template, or booted. */
export type CreatedFrom = 'template' | 'boot' | 'fork';

/** A checkpoint as meta.json records it. */
export interface CheckpointRecord {
  /** Its generation (the checkpoint's id). */
  generation: number;
  label?: string;
  /** When it was written (ISO). */
  createdAt: string;
}

export interface SandboxMeta {
  id: string;
  template: string;
  createdAt: string;
  vcpus: number;
  memoryMiB: number;
  metadata: Record<string, string>;
  envs: Record<string, string>;
  kernel: string;
  rootfs: string;
  /** The kernel command line the sandbox boots with (a boot from disk uses it again). */
  cmdline: string;
  state: SandboxState;
  /** The process that owns (or last owned) the sandbox. */
  ownerPid: number | null;
  /** Lifetime after the last activity, re-armed on connect. */
  timeoutMs?: number;
  onTimeout?: OnTimeout;
  /** An idle pause (onTimeout 'pause') is resumed by the next call on the sandbox in its process. */
  autoResume?: boolean;
  /** The generation the last pause wrote, and when (host wall clock, ISO). */
  generation?: number;
  pausedAt?: string;
  /** Disk layers (relative to the directory, oldest first) under the current top; with
   *  `generation`, the disk that generation froze. A sandbox made from a template starts with
   *  the template's frozen layers, by absolute path under TORPOR_HOME/templates/. */
  diskLayers?: string[];
  createdFrom?: CreatedFrom;
  /** The sandbox it was forked from (createdFrom 'fork'). */
  forkedFrom?: string;
  /** The template build (or fork base) it was restored from (absolute; createdFrom 'template' or 'fork'). */
  templateBuild?: string;
  /** Why it was booted although templates were on (createdFrom 'boot'). */
  bootReason?: string;
  resumedAt?: string;
  resumedFrom?: ResumedFrom;
  /** Why the last resume booted from disk. */
  resumeReason?: string;
  /** A dead owner's sandbox, recovered: what ran after `from` (the last generation) until the
   *  owner was found dead at `to` is lost. ISO times. */
  lostInterval?: { from: string; to: string };
  /** What a dead owner's interval cost: its processes (its disk was booted), or its files too (a generation restored). */
  lost?: 'processes' | 'processes-and-files';
  /** Checkpoints (generations written while the sandbox ran on), oldest first: kept, with their
   *  files, until removed or restored past (docs/sandbox-lifecycle.md#checkpoints). */
  checkpoints?: CheckpointRecord[];
  /** A checkpoint's capture is under way: a generation newer than `generation` is a checkpoint
   *  the machine ran on after, not a final capture (an owner that died then lost work). */
  liveCapture?: boolean;
  /** The network the sandbox was created with (absent: none); every run starts a backend with it. */
  network?: ResolvedNetwork;
  /** The host ports (127.0.0.1) its last run forwarded, by guest port: a resume asks for them again. */
  hostPorts?: Record<string, number>;
  /** Size of the root disk in MiB (absent in sandboxes made before it was recorded). */
  diskMb?: number;
  /** A user template's command defaults: its user ('' the agent's default; a name or 'uid[:gid]') and directory. */
  defaults?: { user: string; cwd: string };
  /** A user template's disk layers (absolute, oldest first): a boot of its disk puts them under the sandbox's top. */
  templateLayers?: string[];
}

const ID_PATTERN = /^sbx_[0-9a-f]{16}$/;

export function newSandboxId(): string {
  return `sbx_${randomHex(8)}`;
}

export function checkSandboxId(id: unknown): string {
  if (typeof id !== 'string' || !ID_PATTERN.test(id)) {
    throw new InvalidArgumentError(`a sandbox id looks like sbx_ and 16 hex digits (got ${JSON.stringify(id)})`);
  }
  return id;
}

function badMeta(path: string, why: string): TorporError {
  return new TorporError('SNAPSHOT_INVALID', `${path} is damaged (${why}); the sandbox cannot be used. Sandbox.kill(id) removes it.`);
}

const isStr = (v: unknown): v is string => typeof v === 'string';
const isStrMap = (v: unknown): v is Record<string, string> =>
  typeof v === 'object' && v !== null && !Array.isArray(v) && Object.values(v).every(isStr);
const isPosInt = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v > 0;

/** Checks meta.json's shape (required fields and the types of optional ones). `templatesRoot`:
 *  where absolute disk layers may lie (a template's); without it only relative ones pass. */
export function parseMeta(text: string, path: string, templatesRoot?: string): SandboxMeta {
  let m: Record<string, unknown>;
  try {
    m = JSON.parse(text) as Record<string, unknown>;
  } catch (err) {
    throw badMeta(path, `not JSON: ${(err as Error).message}`);
  }
  if (typeof m !== 'object' || m === null || Array.isArray(m)) throw badMeta(path, 'not an object');
  for (const k of ['id', 'template', 'createdAt', 'kernel', 'rootfs', 'cmdline'] as const) {
    if (!isStr(m[k])) throw badMeta(path, `${k} is not a string`);
  }
  if (!ID_PATTERN.test(m.id as string)) throw badMeta(path, 'id is malformed');
  if (!isPosInt(m.vcpus) || !isPosInt(m.memoryMiB)) throw badMeta(path, 'vcpus or memoryMiB is not a positive integer');
  if (!isStrMap(m.metadata) || !isStrMap(m.envs)) throw badMeta(path, 'metadata or envs is not a map of strings');
  if (!isSandboxState(m.state)) throw badMeta(path, `unknown state ${JSON.stringify(m.state)}`);
  if (m.ownerPid !== null && !isPosInt(m.ownerPid)) throw badMeta(path, 'ownerPid is malformed');
  if (m.timeoutMs !== undefined && !isPosInt(m.timeoutMs)) throw badMeta(path, 'timeoutMs is malformed');
  if (m.onTimeout !== undefined && m.onTimeout !== 'pause' && m.onTimeout !== 'kill') throw badMeta(path, 'onTimeout is malformed');
  if (m.autoResume !== undefined && typeof m.autoResume !== 'boolean') throw badMeta(path, 'autoResume is malformed');
  if (m.generation !== undefined && !isPosInt(m.generation)) throw badMeta(path, 'generation is malformed');
  for (const k of ['pausedAt', 'resumedAt', 'resumeReason'] as const) {
    if (m[k] !== undefined && !isStr(m[k])) throw badMeta(path, `${k} is not a string`);
  }
  if (m.resumedFrom !== undefined && m.resumedFrom !== 'memory' && m.resumedFrom !== 'disk') throw badMeta(path, 'resumedFrom is malformed');
  if (m.diskLayers !== undefined) {
    if (!Array.isArray(m.diskLayers) || !m.diskLayers.every((p) => isStr(p) && (isPlainRelative(p) || isTemplateLayer(p, templatesRoot)))) {
      throw badMeta(path, 'diskLayers must be relative paths inside the sandbox directory (or a template\'s layers)');
    }
  }
  if (m.createdFrom !== undefined && m.createdFrom !== 'template' && m.createdFrom !== 'boot' && m.createdFrom !== 'fork') throw badMeta(path, 'createdFrom is malformed');
  if (m.forkedFrom !== undefined && !(isStr(m.forkedFrom) && ID_PATTERN.test(m.forkedFrom))) throw badMeta(path, 'forkedFrom is malformed');
  if (m.templateBuild !== undefined && !(isStr(m.templateBuild) && isTemplateLayer(m.templateBuild, templatesRoot))) throw badMeta(path, 'templateBuild is malformed');
  if (m.bootReason !== undefined && !isStr(m.bootReason)) throw badMeta(path, 'bootReason is not a string');
  const lost = m.lostInterval as { from?: unknown; to?: unknown } | undefined;
  if (lost !== undefined && (typeof lost !== 'object' || lost === null || !isStr(lost.from) || !isStr(lost.to))) {
    throw badMeta(path, 'lostInterval is malformed');
  }
  if (m.lost !== undefined && m.lost !== 'processes' && m.lost !== 'processes-and-files') throw badMeta(path, 'lost is malformed');
  if (m.liveCapture !== undefined && typeof m.liveCapture !== 'boolean') throw badMeta(path, 'liveCapture is malformed');
  if (m.checkpoints !== undefined) {
    const ok =
      Array.isArray(m.checkpoints) &&
      m.checkpoints.every((c: unknown) => {
        const r = c as Record<string, unknown>;
        return typeof r === 'object' && r !== null && isPosInt(r.generation) && isStr(r.createdAt) && (r.label === undefined || isStr(r.label));
      });
    if (!ok) throw badMeta(path, 'checkpoints is malformed');
  }
  if (m.network !== undefined && !isNetwork(m.network)) throw badMeta(path, 'network is malformed');
  if (m.diskMb !== undefined && !isPosInt(m.diskMb)) throw badMeta(path, 'diskMb is malformed');
  const d = m.defaults as { user?: unknown; cwd?: unknown } | undefined;
  if (d !== undefined && (typeof d !== 'object' || d === null || !isStr(d.user) || !isStr(d.cwd))) throw badMeta(path, 'defaults is malformed');
  if (m.templateLayers !== undefined) {
    if (!Array.isArray(m.templateLayers) || !m.templateLayers.every((p) => isStr(p) && isTemplateLayer(p, templatesRoot))) throw badMeta(path, "templateLayers must be a template's layers");
  }
  if (m.hostPorts !== undefined) {
    const hp = m.hostPorts as Record<string, unknown>;
    if (typeof hp !== 'object' || hp === null || Array.isArray(hp) || !Object.entries(hp).every(([k, v]) => isPort(Number(k)) && String(Number(k)) === k && isPort(v))) {
      throw badMeta(path, 'hostPorts is malformed');
    }
  }
  return m as unknown as SandboxMeta;
}

const isPort = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v >= 1 && v <= 65535;

function isNetwork(v: unknown): v is ResolvedNetwork {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return false;
  const n = v as Record<string, unknown>;
  return typeof n.egress === 'boolean' && typeof n.allowHostLoopback === 'boolean' && Array.isArray(n.ports) && n.ports.length <= 64 && n.ports.every(isPort);
}

function isPlainRelative(p: string): boolean {
  return p.length > 0 && !p.startsWith('/') && !p.split('/').includes('..') && !p.includes('\0');
}

/** An absolute path inside the templates directory (a template build's layer). */
function isTemplateLayer(p: string, templatesRoot: string | undefined): boolean {
  return templatesRoot !== undefined && p.startsWith(templatesRoot + '/') && isPlainRelative(p.slice(templatesRoot.length + 1));
}

export class SandboxDir {
  readonly path: string;
  /** Where the templates its disk may start from lie. */
  readonly templatesRoot: string;

  constructor(
    readonly id: string,
    home: string = torporHome(),
  ) {
    checkSandboxId(id);
    this.path = join(homeLayout(home).sandboxes, id);
    this.templatesRoot = homeLayout(home).templates;
  }

  get metaPath(): string {
    return join(this.path, 'meta.json');
  }
  get lockPath(): string {
    return join(this.path, 'owner.lock');
  }
  /** The disk's first top layer (create's). */
  get firstOverlay(): string {
    return join(this.path, 'overlay');
  }
  get snapshots(): string {
    return join(this.path, 'snapshots');
  }
  get consoleLog(): string {
    return join(this.path, 'console.log');
  }
  /** Where a boot from disk puts its new top layer. */
  /**
   * The disk top a dead owner's machine was writing after `generation` (restored from it, or
   * booted from its disk: snapshots/tops/disk0-{r,g,boot}<generation>-<pid>-*.overlay, with its
   * map; the newest when there are several), moved into layers/, out of tops/ (whose files the
   * sweep after a pause removes once their machine stopped), so it can be a frozen layer of the
   * disk booted from it. null when there is none.
   */
  async adoptDeadOwnerTop(generation: number, ownerPid: number | null): Promise<string | null> {
    if (ownerPid === null) return null;
    // In layers/: the machine's own layers (merged with the rest once the chain is long), swept
    // after a pause once no generation names it.
    const adopted = join(this.snapshots, 'layers', `disk0-recovered-g${generation}-${ownerPid}.overlay`);
    // Adopted by an earlier connect that then failed: the same layer, still the dead machine's last disk.
    if (await stat(adopted).then(() => true, () => false)) return adopted;
    const tops = join(this.snapshots, 'tops');
    const pattern = new RegExp(`^disk0-(?:r|g|boot)${generation}-${ownerPid}-[0-9a-f]+\\.overlay$`);
    let best: { name: string; mtime: number } | null = null;
    for (const name of await readdir(tops).catch(() => [] as string[])) {
      if (!pattern.test(name)) continue;
      const st = await stat(join(tops, name)).catch(() => null);
      // A top never flushed has an empty map: nothing in it was promised to the guest (reads go
      // to the layers below), and after a host crash its files may be there only in part (the
      // addon syncs a new top's directory at its first flush): not worth a layer, nor a failure.
      const map = await stat(join(tops, `${name}.map`)).catch(() => null);
      if (!st || !map || map.size === 0) continue;
      if (!best || st.mtimeMs > best.mtime) best = { name, mtime: st.mtimeMs };
    }
    if (!best) return null;
    await mkdir(dirname(adopted), { recursive: true });
    await rename(join(tops, `${best.name}.map`), `${adopted}.map`);
    await rename(join(tops, best.name), adopted);
    await fsyncPath(dirname(adopted));
    return adopted;
  }

  bootTop(generation: number): string {
    return join(this.snapshots, 'tops', `disk0-boot${generation}-${process.pid}-${randomHex(4)}.overlay`);
  }

  async exists(): Promise<boolean> {
    return lstat(this.metaPath).then(
      () => true,
      () => false,
    );
  }

  async create(): Promise<void> {
    await mkdir(this.path, { recursive: true });
  }

  /** meta.json; SANDBOX_NOT_FOUND when there is none. */
  async readMeta(): Promise<SandboxMeta> {
    let text: string;
    try {
      text = await readFile(this.metaPath, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
        throw new SandboxNotFoundError(`no sandbox ${this.id} in ${this.path} (Sandbox.list() shows the ones there are)`);
      }
      throw err;
    }
    const meta = parseMeta(text, this.metaPath, this.templatesRoot);
    if (meta.id !== this.id) throw badMeta(this.metaPath, `it names ${meta.id}`);
    return meta;
  }

  /** Replaces meta.json durably: a crash leaves the old one or the new one. */
  async writeMeta(meta: SandboxMeta): Promise<void> {
    await replaceFileDurably(this.metaPath, JSON.stringify(meta, null, 2) + '\n');
  }

  /** The temporary files of meta.json writes whose process died before the rename (a SIGKILL
   *  mid-write) go; those of a live process stay. Returns how many were removed. */
  async dropStaleMetaTemps(): Promise<number> {
    let removed = 0;
    for (const name of await readdir(this.path).catch(() => [] as string[])) {
      const m = /^meta\.json\.(\d{1,10})\.[0-9a-f]+\.tmp$/.exec(name);
      if (!m || processAlive(Number(m[1]))) continue;
      if (await unlink(join(this.path, name)).then(() => true, () => false)) removed++;
    }
    return removed;
  }

  /** writeMeta() for a process that is ending (an `exit` handler: nothing asynchronous runs). */
  writeMetaSync(meta: SandboxMeta): void {
    const tmp = tempBeside(this.metaPath);
    const fd = openSync(tmp, 'w');
    try {
      writeSync(fd, JSON.stringify(meta, null, 2) + '\n');
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, this.metaPath);
    const dfd = openSync(this.path, 'r');
    try {
      fsyncSync(dfd);
    } finally {
      closeSync(dfd);
    }
  }

  /** The generation `snapshots/current` names; 0 when none was written. */
  async currentGeneration(): Promise<number> {
    return currentGenerationOf(this.snapshots);
  }

  /**
   * The disk as generation `generation` froze it: the layers recorded in meta.json for its
   * generation (or, never paused, its template's), then the layers of any later generation up
   * to `generation` (a pause whose meta.json update did not happen). Paths are absolute,
   * oldest first. A manifest that names the generation's disk layers (every one the addon
   * writes now) is taken as it is.
   */
  async diskLayersAt(meta: SandboxMeta, generation: number): Promise<string[]> {
    // The generation's manifest names its disk exactly (merged layers included).
    const named = generation > 0 ? generationDiskLayers(this, generation) : null;
    if (named && named.every((p) => isPlainRelative(p) || isTemplateLayer(p, this.templatesRoot)))
      return named.map((p) => (p.startsWith('/') ? p : join(this.path, p)));
    const recorded = meta.generation !== undefined && meta.generation <= generation ? meta.generation : 0;
    const layers = recorded || meta.generation === undefined ? [...(meta.diskLayers ?? [])] : [];
    for (let g = recorded + 1; g <= generation; g++) {
      const p = frozenDiskTop(g);
      if (await stat(join(this.path, p)).then(() => true, () => false)) layers.push(p);
    }
    return layers.map((p) => (p.startsWith('/') ? p : join(this.path, p)));
  }

  /** A layer path as meta.json records it: relative inside the directory, else absolute (a template's). */
  metaPathOf(p: string): string {
    return metaPathIn(this.path, p);
  }

  /** Bytes the directory takes on disk (allocated blocks; a file linked twice counts once). */
  async bytesOnDisk(): Promise<number> {
    const seen = new Set<string>();
    let total = 0;
    const walk = async (dir: string): Promise<void> => {
      for (const entry of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
        const p = join(dir, entry.name);
        const st = await lstat(p).catch(() => null);
        if (!st) continue;
        const key = `${st.dev}:${st.ino}`;
        if (seen.has(key)) continue;
        seen.add(key);
        total += st.blocks * 512;
        if (st.isDirectory()) await walk(p);
      }
    };
    await walk(this.path);
    return total;
  }

  /**
   * After a pause that stopped the machine: the top layers (each frozen one is hard-linked into
   * its generation) and create's first overlay are no longer anyone's, unless the generation's
   * disk names the first overlay itself (a sandbox never paused, booted from that disk).
   */
  async dropUnusedTops(diskLayers: readonly string[]): Promise<void> {
    await rm(join(this.snapshots, 'tops'), { recursive: true, force: true });
    if (diskLayers.includes('overlay')) return;
    for (const p of [this.firstOverlay, `${this.firstOverlay}.map`]) await unlink(p).catch(() => undefined);
  }

  /**
   * A template sandbox never paused, whose owner died: the disk top its restore wrote (under
   * snapshots/tops/, named by the addon `disk0-r<gen>-<pid>-<n>.overlay`) becomes the first
   * overlay, as a booted sandbox's is, so the boot from disk has its writes (crash-consistent).
   * Does nothing unless there is exactly one such top and no first overlay yet.
   */
  async adoptRestoreTop(): Promise<void> {
    if (await lstat(this.firstOverlay).then(() => true, () => false)) return;
    const tops = join(this.snapshots, 'tops');
    const names = (await readdir(tops).catch(() => [] as string[])).filter((n) => /^disk0-r\d+-\d+-\d+\.overlay$/.test(n));
    if (names.length !== 1) return;
    await rename(join(tops, names[0]!), this.firstOverlay);
    await rename(join(tops, `${names[0]!}.map`), `${this.firstOverlay}.map`).catch(() => undefined);
    await fsyncPath(this.path);
  }

  async remove(): Promise<void> {
    // Renamed aside first: a reader never sees half a directory under the sandbox's name.
    const aside = join(this.path, '..', `.removing-${this.id}-${randomHex(3)}`);
    try {
      await rename(this.path, aside);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return;
      throw err;
    }
    await rm(aside, { recursive: true, force: true });
  }
}

/** The ids of the sandboxes under a torpor home. */
export async function sandboxIds(home: string = torporHome()): Promise<string[]> {
  const names = await readdir(homeLayout(home).sandboxes).catch(() => [] as string[]);
  return names.filter((n) => ID_PATTERN.test(n)).sort();
}
