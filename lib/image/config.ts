// The parts of an image config torpor applies (env, working directory, user, entrypoint and
// command) or checks (os, architecture), from the OCI / docker config JSON. Docker writes
// null for an absent Entrypoint or Cmd; both spellings of "absent" read as empty.
import { TorporError } from '../errors.js';
import type { ImageConfig } from './types.js';

function bad(what: string, why: string): TorporError {
  return new TorporError('IMAGE_INVALID', `image config of ${what} is invalid: ${why}`);
}

function stringList(value: unknown, field: string, what: string): string[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) throw bad(what, `${field} is not a list of strings`);
  return value as string[];
}

function optionalString(value: unknown, field: string, what: string): string {
  if (value === undefined || value === null) return '';
  if (typeof value !== 'string') throw bad(what, `${field} is not a string`);
  return value;
}

/**
 * The ImageConfig of a config blob (its bytes, its text or the parsed JSON). `what` names the
 * image in messages. Throws IMAGE_INVALID for anything that is not a config object.
 */
export function parseImageConfig(json: unknown, what = 'the image'): ImageConfig {
  let doc: unknown = json;
  if (Buffer.isBuffer(doc)) doc = doc.toString('utf8');
  if (typeof doc === 'string') {
    try {
      doc = JSON.parse(doc);
    } catch (err) {
      throw bad(what, `not JSON (${(err as Error).message})`);
    }
  }
  if (typeof doc !== 'object' || doc === null || Array.isArray(doc)) throw bad(what, 'not a JSON object');
  const top = doc as Record<string, unknown>;
  if (typeof top.architecture !== 'string' || top.architecture === '') throw bad(what, 'no architecture');
  if (typeof top.os !== 'string' || top.os === '') throw bad(what, 'no os');
  const inner = top.config ?? {};
  if (typeof inner !== 'object' || inner === null || Array.isArray(inner)) throw bad(what, 'config is not an object');
  const c = inner as Record<string, unknown>;
  const env = stringList(c.Env, 'Env', what);
  for (const e of env) if (!e.includes('=') || e.startsWith('=')) throw bad(what, `Env entry ${JSON.stringify(e)} is not KEY=value`);
  return {
    architecture: top.architecture,
    os: top.os,
    env,
    workingDir: optionalString(c.WorkingDir, 'WorkingDir', what),
    user: optionalString(c.User, 'User', what),
    entrypoint: stringList(c.Entrypoint, 'Entrypoint', what),
    cmd: stringList(c.Cmd, 'Cmd', what),
  };
}

/** IMAGE_PLATFORM unless the config is for linux/amd64 (the only guest torpor runs). */
export function checkPlatform(config: ImageConfig, what: string): void {
  if (config.os !== 'linux' || config.architecture !== 'amd64') {
    throw new TorporError(
      'IMAGE_PLATFORM',
      `${what} is built for ${config.os}/${config.architecture}; torpor runs linux/amd64 images only`,
    );
  }
}
