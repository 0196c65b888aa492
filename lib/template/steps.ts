// A template's steps, run in order in a booted sandbox of its parent: commands through the
// agent (failing the build on a non-zero exit, with the step's output), host files copied in,
// and env / workdir changes that apply to the later steps and become the template's defaults.
import { lstat, readdir, readFile, readlink } from 'node:fs/promises';
import { join, posix } from 'node:path';

import { TorporError } from '../errors.js';
import type { AgentApi } from '../sandbox/agent-api.js';
import type { CommandDefaults } from '../sandbox/commands.js';
import { checkEnvs, checkKnownKeys, checkObject, checkString, fail } from '../sandbox/validate.js';
import type { TemplateDefaults } from './record.js';
import { parseImageUser, userRequest } from './user.js';

/**
 * One step of {@link Template.build}: run a command, copy host files in, or set the environment
 * or working directory of the later steps (and the template's defaults). A run step that exits
 * non-zero fails the build (TEMPLATE_BUILD_FAILED, with its output).
 */
export type TemplateStep =
  | {
      /** The command: a shell line (run by `/bin/bash -l -c`), or argv. */
      run: string | string[];
      /** Run as this user ('name', 'uid' or 'uid:gid'; default the template's). */
      user?: string;
      /** How long it may take (default 30 minutes). */
      timeoutMs?: number;
    }
  | {
      /** Copy a host file, directory or symlink into the guest. */
      copy: {
        /** The host path (a relative one is relative to this process's working directory). */
        from: string;
        /** The absolute guest path. */
        to: string;
      };
      /** Owner of the copied files (default the template's user). */
      user?: string;
    }
  | {
      /** Set these variables for the later steps and the template's sandboxes. */
      env: Record<string, string>;
    }
  | {
      /** Absolute guest directory the later steps and the template's sandboxes run in. */
      workdir: string;
    };

/** How long one `run` step may take unless it says (npm install of a real project: minutes). */
const STEP_TIMEOUT_MS = 30 * 60_000;

export function checkSteps(steps: unknown): asserts steps is TemplateStep[] | undefined {
  if (steps === undefined) return;
  if (!Array.isArray(steps)) fail('opts.steps', 'an array of steps', steps);
  steps.forEach((s: unknown, i) => {
    const what = `opts.steps[${i}]`;
    checkObject(what, s);
    const o = (s ?? {}) as Record<string, unknown>;
    if ('run' in o) {
      checkKnownKeys(what, o, ['run', 'user', 'timeoutMs']);
      const run = o.run;
      if (Array.isArray(run)) {
        if (run.length === 0 || !run.every((a) => typeof a === 'string' && !a.includes('\0'))) fail(`${what}.run`, 'a non-empty array of strings', run);
      } else checkString(`${what}.run`, run, { nonEmpty: true });
      checkString(`${what}.user`, o.user, { nonEmpty: true });
    } else if ('copy' in o) {
      checkKnownKeys(what, o, ['copy', 'user']);
      checkObject(`${what}.copy`, o.copy);
      const c = (o.copy ?? {}) as Record<string, unknown>;
      checkKnownKeys(`${what}.copy`, c, ['from', 'to']);
      checkString(`${what}.copy.from`, c.from, { nonEmpty: true });
      checkString(`${what}.copy.to`, c.to, { nonEmpty: true });
      if (typeof c.to !== 'string' || !c.to.startsWith('/')) fail(`${what}.copy.to`, 'an absolute guest path', c.to);
      checkString(`${what}.user`, o.user, { nonEmpty: true });
    } else if ('env' in o) {
      checkKnownKeys(what, o, ['env']);
      checkEnvs(`${what}.env`, o.env);
    } else if ('workdir' in o) {
      checkKnownKeys(what, o, ['workdir']);
      checkString(`${what}.workdir`, o.workdir, { nonEmpty: true });
      if (!(o.workdir as string).startsWith('/')) fail(`${what}.workdir`, 'an absolute guest path', o.workdir);
    } else fail(what, 'one of { run }, { copy }, { env }, { workdir }', JSON.stringify(s));
  });
}

export interface StepProgress {
  index: number;
  total: number;
  step: TemplateStep;
  /** Output of a run step, as it comes. */
  output?: string;
}

/** What a step's commands inherit, as the agent API takes it. */
export function commandDefaultsOf(d: TemplateDefaults, user: string = d.user): CommandDefaults {
  return { envs: d.envs, ...(d.cwd ? { cwd: d.cwd } : {}), ...(user ? parseImageUser(user) : {}) };
}

/**
 * Runs `steps` starting from `defaults` (`apiFor` gives the agent API with a step's defaults);
 * returns the defaults the steps leave.
 */
export async function runSteps(
  apiFor: (defaults: CommandDefaults) => AgentApi,
  steps: TemplateStep[],
  defaults: TemplateDefaults,
  onStep?: (p: StepProgress) => void,
): Promise<TemplateDefaults> {
  const api = apiFor({});
  let d: TemplateDefaults = { envs: { ...defaults.envs }, user: defaults.user, cwd: defaults.cwd };
  for (const [index, step] of steps.entries()) {
    onStep?.({ index, total: steps.length, step });
    if ('env' in step) {
      d = { ...d, envs: { ...d.envs, ...step.env } };
    } else if ('workdir' in step) {
      await api.files.makeDir(step.workdir, { ...userRequest(d.user, 'files') });
      d = { ...d, cwd: step.workdir };
    } else if ('run' in step) {
      const commands = apiFor(commandDefaultsOf(d, step.user ?? d.user)).commands;
      const res = await commands.run(step.run as string, {
        timeoutMs: step.timeoutMs ?? STEP_TIMEOUT_MS,
        throwOnError: false,
        onStdout: (s: string) => onStep?.({ index, total: steps.length, step, output: s }),
        onStderr: (s: string) => onStep?.({ index, total: steps.length, step, output: s }),
      } as never);
      const r = res as unknown as { exitCode: number; stdout: string; stderr: string };
      if (r.exitCode !== 0) {
        const tail = (r.stderr || r.stdout).trimEnd().split('\n').slice(-20).join('\n');
        const shown = Array.isArray(step.run) ? step.run.join(' ') : step.run;
        throw new TorporError('TEMPLATE_BUILD_FAILED', `step ${index + 1} (${JSON.stringify(shown.slice(0, 120))}) exited with code ${r.exitCode}:\n${tail}`);
      }
    } else {
      await copyIn(api, step.copy.from, step.copy.to, step.user ?? d.user);
    }
  }
  return d;
}

/** A host file or directory tree into the guest, modes kept, owned by `user`. */
async function copyIn(api: AgentApi, from: string, to: string, user: string): Promise<void> {
  const st = await lstat(from).catch((err: unknown) => {
    throw new TorporError('FILE_NOT_FOUND', `copy step: ${from} does not exist on the host`, { cause: err });
  });
  const who = userRequest(user, 'files');
  if (st.isDirectory()) {
    await api.files.makeDir(to, { ...who, mode: st.mode & 0o7777 });
    for (const name of (await readdir(from)).sort()) await copyIn(api, join(from, name), posix.join(to, name), user);
  } else if (st.isFile()) {
    await api.files.write(to, await readFile(from), { ...who, mode: st.mode & 0o7777 });
  } else if (st.isSymbolicLink()) {
    // The agent has no symlink request: a link is made by the guest's own ln when it has one.
    const target = await readlink(from);
    const r = (await api.commands.run(['ln', '-sfn', target, to] as never, { throwOnError: false } as never)) as unknown as { exitCode: number };
    if (r.exitCode !== 0) throw new TorporError('TEMPLATE_BUILD_FAILED', `copy step: could not make the symlink ${to} -> ${target} in the guest`);
  } else {
    throw new TorporError('INVALID_ARGUMENT', `copy step: ${from} is neither a file, a directory nor a symlink`);
  }
}
