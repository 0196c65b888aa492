// Template: build, list, get and remove templates (docs/templates.md). User templates are
// records under templates/<name>/ (record.ts); the automatic ones (the base's and each image's
// warm template, one per machine size) are listed beside them with their settings.
import { readdir, readFile, rm, stat } from 'node:fs/promises';
import { join } from 'node:path';

import { TemplateNotFoundError, TorporError } from '../errors.js';
import type { ImageConfig } from '../image/types.js';
import { checkBool, checkKnownKeys, checkObject, checkString } from '../sandbox/validate.js';
import { checkTemplateName } from '../sandbox/template.js';
import { homeLayout, torporHome } from '../store/home.js';
import { SandboxDir, sandboxIds } from '../store/sandbox-dir.js';
import { buildTemplate, type TemplateBuildOpts } from './build.js';
import { isReservedTemplateName, readTemplateRecord, userTemplateDir, userTemplateNames, type TemplateFrom, type TemplateRecord } from './record.js';
import type { Resources } from './resources.js';

export type { TemplateBuildOpts, TemplateBuildProgress } from './build.js';
export type { TemplateStep } from './steps.js';
export type { TemplateFrom } from './record.js';

/** What a template is: {@link Template.build}, {@link Template.list} and {@link Template.get} report it. */
export interface TemplateInfo {
  /** Its name ('base' and 'image-...' are the automatic ones). */
  name: string;
  /** 'user': built with Template.build; 'automatic': a warm template torpor made by itself. */
  kind: 'user' | 'automatic';
  /** What it was built on, as the build was told (user templates). */
  from?: TemplateFrom;
  /** What it was built on ('base', a template's name, or an image's automatic template). */
  parent?: string;
  /** When it was built. */
  createdAt: Date;
  /** The machine size of its sandboxes (unless create asks for another). */
  resources: Resources;
  /** What every command of its sandboxes gets unless it says otherwise. */
  env: Record<string, string>;
  /** The working directory of its sandboxes' commands ('' : the user's home). */
  workdir: string;
  /** '' : the agent's default user (`user` in the base image, else root). */
  user: string;
  /** The image it came from: its digests, and Entrypoint / Cmd (recorded, never run by torpor). */
  image?: {
    /** Where it came from ('node:22', 'oci-layout:/dir', 'docker-archive:/f.tar'). */
    source: string;
    /** The image manifest's digest (the linux/amd64 one of a list). */
    manifestDigest: string;
    /** The config blob's digest: the image's identity. */
    configDigest: string;
    /** The image's Entrypoint. */
    entrypoint: string[];
    /** The image's Cmd. */
    cmd: string[];
    /** The part of the image's config torpor applies or records. */
    config: ImageConfig;
  };
  /** How many steps the build ran. */
  steps?: number;
  /** Time the build took, by phase (ms: pull, unpack, boot, restore, steps, capture, total). */
  timings?: Record<string, number>;
  /** Sandboxes (and templates) that use its memory or disk. */
  dependents: string[];
}

function infoOfRecord(r: TemplateRecord, dependents: string[]): TemplateInfo {
  return {
    name: r.name,
    kind: 'user',
    from: r.from,
    parent: r.parent,
    createdAt: new Date(r.createdAt),
    resources: { ...r.resources },
    env: { ...r.defaults.envs },
    workdir: r.defaults.cwd,
    user: r.defaults.user,
    ...(r.image ? { image: r.image } : {}),
    steps: r.steps,
    timings: r.timings,
    dependents,
  };
}

/** Everything that names a file under `dir`: sandboxes (by id) and user templates (by name). */
async function dependentsOf(dir: string, except: string, home: string): Promise<string[]> {
  const under = (p: string | undefined) => p !== undefined && p.startsWith(dir + '/');
  const out: string[] = [];
  for (const id of await sandboxIds(home)) {
    const meta = await new SandboxDir(id, home).readMeta().catch(() => undefined);
    if (!meta) continue;
    if (under(meta.templateBuild) || (meta.diskLayers ?? []).some(under)) out.push(id);
  }
  for (const name of await userTemplateNames(home)) {
    if (name === except) continue;
    const r = await readTemplateRecord(name, home).catch(() => null);
    if (r && (under(r.build.dir) || r.build.diskLayers.some(under))) out.push(`template:${name}`);
  }
  return out;
}

/** The automatic templates: templates/<base|image-…>/<key>/ with a current build. */
async function automaticTemplates(home: string): Promise<TemplateInfo[]> {
  const root = homeLayout(home).templates;
  const out: TemplateInfo[] = [];
  for (const e of await readdir(root, { withFileTypes: true }).catch(() => [])) {
    if (!e.isDirectory() || !isReservedTemplateName(e.name)) continue;
    for (const key of await readdir(join(root, e.name)).catch(() => [] as string[])) {
      const current = (await readFile(join(root, e.name, key, 'current'), 'utf8').catch(() => '')).trim();
      if (!current) continue;
      const rec = JSON.parse(await readFile(join(root, e.name, key, current, 'template.json'), 'utf8').catch(() => 'null')) as {
        createdAt?: string;
        inputs?: { vcpus: number; memoryMiB: number; rootfs: string };
      } | null;
      if (!rec?.inputs) continue;
      const diskBytes = (await stat(rec.inputs.rootfs).catch(() => undefined))?.size ?? 0;
      out.push({
        name: e.name,
        kind: 'automatic',
        createdAt: new Date(rec.createdAt ?? 0),
        resources: { cpu: rec.inputs.vcpus, memoryMb: rec.inputs.memoryMiB, diskMb: Math.floor(diskBytes / 1048576) },
        env: {},
        workdir: '',
        user: '',
        dependents: await dependentsOf(join(root, e.name, key), '', home),
      });
    }
  }
  return out;
}

/**
 * Builds, lists, reads and removes templates: a machine captured after some steps (packages
 * installed, files copied) that sandboxes start from, warm. All static. docs/templates.md.
 */
export class Template {
  private constructor() {}

  /**
   * Builds template `opts.name` (replacing one of that name: sandboxes made from the old build
   * keep it): from 'base', another template, or a container image; steps run in a booted
   * sandbox of it, and the result (memory and disk) is what every sandbox from it starts from.
   *
   * @param opts - The name, what it is built on, the steps and the defaults its sandboxes get.
   * @returns The template built.
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for a bad name, step or option.
   * @throws {@link TemplateNotFoundError} (TEMPLATE_NOT_FOUND) when `from` names no template.
   * @throws {@link KvmUnavailableError} (KVM_UNAVAILABLE) when this host cannot run a Linux guest.
   * @throws {@link TorporError} TEMPLATE_BUILD_FAILED when a step fails (its output in the
   *   message); IMAGE_NOT_FOUND, IMAGE_PLATFORM, IMAGE_INVALID, REGISTRY_AUTH,
   *   REGISTRY_UNREACHABLE or BLOB_CORRUPT when the image cannot be fetched; OUT_OF_SPACE when
   *   its files do not fit.
   */
  static async build(opts: TemplateBuildOpts): Promise<TemplateInfo> {
    const record = await buildTemplate(opts);
    return infoOfRecord(record, []);
  }

  /**
   * Every template: the user ones, then the automatic ones (one entry per machine size).
   *
   * @returns One {@link TemplateInfo} each (a record that cannot be read is left out).
   */
  static async list(): Promise<TemplateInfo[]> {
    const home = torporHome();
    const out: TemplateInfo[] = [];
    for (const name of await userTemplateNames(home)) {
      const r = await readTemplateRecord(name, home).catch(() => null);
      if (r) out.push(infoOfRecord(r, await dependentsOf(userTemplateDir(name, home), name, home)));
    }
    return [...out, ...(await automaticTemplates(home))];
  }

  /**
   * One template by name.
   *
   * @param name - A user template's name, 'base', or an automatic template's name.
   * @returns Its info ('base' before its first use: the default size, no build yet).
   * @throws {@link TemplateNotFoundError} (TEMPLATE_NOT_FOUND) when there is none of that name.
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for a malformed name.
   */
  static async get(name: string): Promise<TemplateInfo> {
    checkString('name', name, { nonEmpty: true });
    checkTemplateName(name);
    const home = torporHome();
    if (isReservedTemplateName(name)) {
      const found = (await automaticTemplates(home)).filter((t) => t.name === name);
      if (found.length === 0 && name !== 'base') throw new TemplateNotFoundError(`no template named ${JSON.stringify(name)}`);
      if (found.length === 0) {
        return { name, kind: 'automatic', createdAt: new Date(0), resources: { cpu: 2, memoryMb: 512, diskMb: 0 }, env: {}, workdir: '', user: '', dependents: [] };
      }
      return found[0]!;
    }
    const r = await readTemplateRecord(name, home);
    if (!r) throw new TemplateNotFoundError(`no template named ${JSON.stringify(name)}`);
    return infoOfRecord(r, await dependentsOf(userTemplateDir(name, home), name, home));
  }

  /**
   * Removes a user template. Refused (TEMPLATE_IN_USE, naming them) while sandboxes or other
   * templates use its memory or disk, unless `force`: then its name goes, and its builds stay
   * on disk until nothing names them (a sandbox never loses its files to a remove).
   *
   * @param name - The user template's name.
   * @param opts - `force`: remove the name even while it is used.
   * @throws {@link TemplateNotFoundError} (TEMPLATE_NOT_FOUND) when there is none of that name.
   * @throws {@link TorporError} TEMPLATE_IN_USE while it is used and `force` is not set.
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for an automatic template or a malformed name.
   */
  static async remove(name: string, opts: { force?: boolean } = {}): Promise<void> {
    checkString('name', name, { nonEmpty: true });
    checkObject('opts', opts);
    checkKnownKeys('opts', opts, ['force']);
    checkBool('opts.force', opts.force);
    checkTemplateName(name);
    if (isReservedTemplateName(name)) throw new TorporError('INVALID_ARGUMENT', `${name} is an automatic template; torpor manages it`);
    const home = torporHome();
    const r = await readTemplateRecord(name, home);
    if (!r) throw new TemplateNotFoundError(`no template named ${JSON.stringify(name)}`);
    const dir = userTemplateDir(name, home);
    const dependents = await dependentsOf(dir, name, home);
    if (dependents.length > 0 && !opts.force) {
      throw new TorporError('TEMPLATE_IN_USE', `template ${name} is used by ${dependents.join(', ')}: kill those first, or remove it with { force: true } (its files stay until nothing uses them)`);
    }
    await rm(join(dir, 'template.json'), { force: true });
    if (dependents.length === 0) {
      await rm(dir, { recursive: true, force: true });
      return;
    }
    // Forced: the builds nothing names go now; the others stay for their users.
    const used = (b: string) => dependents.length > 0 && b !== '';
    for (const b of await readdir(join(dir, 'builds')).catch(() => [] as string[])) {
      const path = join(dir, 'builds', b);
      const users = await dependentsOf(path, name, home);
      if (!used(b) || users.length === 0) await rm(path, { recursive: true, force: true });
    }
  }
}
