// A user template on disk (docs/templates.md):
//
//   templates/<name>/template.json     the record below; replaced atomically by a rebuild
//   templates/<name>/build.lock        held while a build of <name> runs
//   templates/<name>/builds/b-<ms>-<hex>/   a build: current, gen-N/{vm.state, mem.layer,
//                                      disk0.overlay}; read-only once renamed into place
//
// A template with no steps has no build of its own: its record names its parent's build (the
// automatic warm template of an image or of the base, or another user template's), so two
// templates from one image share memory and disk. Builds are never rewritten: sandboxes and
// child templates name their layers by absolute path.
import { mkdir, readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';

import { TorporError } from '../errors.js';
import { replaceFileDurably } from '../store/fsync.js';
import { homeLayout, torporHome } from '../store/home.js';
import type { ImageConfig } from '../image/types.js';
import type { Resources } from './resources.js';

/** What a template is built on: 'base' or a template's name; or a container image from a registry, an OCI layout directory, or a `docker save` archive. */
export type TemplateFrom =
  | string
  | {
      /** A registry reference ('node:22', 'ghcr.io/owner/app:tag', '...@sha256:...'); linux/amd64 is picked from a list. */
      image: string;
    }
  | {
      /** Path of an OCI image layout directory. */
      ociLayout: string;
      /** Which of its images (its `org.opencontainers.image.ref.name`), when it holds more than one. */
      tag?: string;
    }
  | {
      /** Path of a `docker save` tar archive. */
      dockerArchive: string;
    };

/** What every command of a sandbox from the template gets unless it says otherwise. */
export interface TemplateDefaults {
  envs: Record<string, string>;
  /** '' for the agent's default; else a name or 'uid[:gid]'. */
  user: string;
  cwd: string;
}

export interface TemplateRecord {
  version: 1;
  name: string;
  from: TemplateFrom;
  /** The template it was built on: 'base', a user template's name, or the image's automatic one. */
  parent: string;
  createdAt: string;
  resources: Resources;
  defaults: TemplateDefaults;
  /** The image it came from (through its parent chain), when one. */
  image?: { source: string; manifestDigest: string; configDigest: string; entrypoint: string[]; cmd: string[]; config: ImageConfig };
  steps: number;
  /** What the machine is restored from. */
  build: {
    dir: string;
    kernel: string;
    rootfs: string;
    cmdline: string;
    /** Absolute, oldest first. */
    diskLayers: string[];
    mac: string;
    net: boolean;
  };
  /** Time the build took, by phase (ms). */
  timings: Record<string, number>;
}

const RESERVED = /^(base|image-[0-9a-f]{16})$/;

export function isReservedTemplateName(name: string): boolean {
  return RESERVED.test(name);
}

export function userTemplateDir(name: string, home: string = torporHome()): string {
  return join(homeLayout(home).templates, name);
}

function recordPath(name: string, home?: string): string {
  return join(userTemplateDir(name, home), 'template.json');
}

function isStringArray(v: unknown): v is string[] {
  return Array.isArray(v) && v.every((x) => typeof x === 'string');
}

/** The record of user template `name`, or null when there is none (a damaged one is an error). */
export async function readTemplateRecord(name: string, home?: string): Promise<TemplateRecord | null> {
  const path = recordPath(name, home);
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new TorporError('IO_ERROR', `cannot read ${path}: ${(err as Error).message}`, { cause: err });
  }
  let r: TemplateRecord;
  try {
    r = JSON.parse(text) as TemplateRecord;
  } catch (err) {
    throw new TorporError('SNAPSHOT_INVALID', `template ${name}: ${path} is not JSON`, { cause: err });
  }
  const templates = homeLayout(home ?? torporHome()).templates;
  const b = r?.build;
  const ok =
    r?.version === 1 &&
    r.name === name &&
    typeof r.parent === 'string' &&
    b !== undefined &&
    typeof b.dir === 'string' &&
    b.dir.startsWith(templates + '/') &&
    isStringArray(b.diskLayers) &&
    b.diskLayers.every((p) => p.startsWith(templates + '/') && !p.split('/').includes('..')) &&
    typeof b.rootfs === 'string' &&
    typeof b.kernel === 'string' &&
    typeof b.cmdline === 'string' &&
    typeof b.mac === 'string' &&
    typeof r.resources?.cpu === 'number' &&
    typeof r.resources?.memoryMb === 'number' &&
    typeof r.resources?.diskMb === 'number' &&
    typeof r.defaults?.user === 'string' &&
    typeof r.defaults?.cwd === 'string';
  if (!ok) throw new TorporError('SNAPSHOT_INVALID', `template ${name}: ${path} is not a template record this version reads`);
  return r;
}

export async function writeTemplateRecord(record: TemplateRecord, home?: string): Promise<void> {
  const dir = userTemplateDir(record.name, home);
  await mkdir(dir, { recursive: true });
  await replaceFileDurably(recordPath(record.name, home), JSON.stringify(record, null, 2) + '\n');
}

/** Names of the user templates (directories with a template.json). */
export async function userTemplateNames(home?: string): Promise<string[]> {
  const root = homeLayout(home ?? torporHome()).templates;
  const names: string[] = [];
  for (const e of await readdir(root, { withFileTypes: true }).catch(() => [])) {
    if (!e.isDirectory() || isReservedTemplateName(e.name)) continue;
    try {
      await readFile(join(root, e.name, 'template.json'));
      names.push(e.name);
    } catch {
      /* not a user template */
    }
  }
  return names.sort();
}
