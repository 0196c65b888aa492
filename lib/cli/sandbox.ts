// `torpor ls|info|exec|shell|logs|pause|kill|prune`: the Sandbox API on the command line, for
// sandboxes any process made. A command that must talk to the guest connects (taking the
// owner lock, so a sandbox another live process runs is refused with SANDBOX_BUSY naming its
// pid) and pauses the sandbox again before it exits: the CLI never leaves a machine running
// without an owner, and never kills one it only looked at.
import { stat } from 'node:fs/promises';
import { parseArgs, type ParseArgsConfig } from 'node:util';

import { CommandExitError, InvalidArgumentError, TorporError } from '../errors.js';
import { Sandbox, type SandboxInfo, type SandboxState } from '../sandbox/sandbox.js';
import { SANDBOX_STATES } from '../sandbox/lifecycle.js';
import { dropForkBaseIfUnused, forkBases, forkBaseUnused } from '../sandbox/fork.js';
import { pruneInterruptedCreates } from '../store/interrupted-create.js';
import { formatAge, formatBytes, parseDuration, table } from './format.js';

function parse(argv: string[], options: NonNullable<ParseArgsConfig['options']>) {
  try {
    return parseArgs({ args: argv, options, strict: true, allowPositionals: true });
  } catch (err) {
    throw new InvalidArgumentError(`${(err as Error).message} (see torpor --help)`);
  }
}

function oneId(command: string, positionals: string[]): string {
  if (positionals.length !== 1) throw new InvalidArgumentError(`torpor ${command} takes one sandbox ID`);
  return positionals[0]!;
}

/** A line on stderr for a step a person would otherwise wait on in silence (never in --json runs, never when stderr is not a terminal). */
function progress(quiet: boolean): (line: string) => void {
  return quiet || !process.stderr.isTTY ? () => undefined : (line) => process.stderr.write(`${line}\n`);
}

/**
 * Connects, runs `fn`, then pauses the sandbox again, whatever `fn` did (a failed pause is
 * reported and turns a success into exit status 1: the sandbox was not left as it was found).
 */
async function withSandbox(id: string, say: (line: string) => void, fn: (sbx: Sandbox) => Promise<number>): Promise<number> {
  say(`resuming ${id}...`);
  const sbx = await Sandbox.connect(id);
  let status: number;
  try {
    status = await fn(sbx);
  } finally {
    say(`pausing ${id}...`);
    await sbx.pause();
  }
  return status;
}

function infoJson(info: SandboxInfo): Record<string, unknown> {
  return { ...info };
}

async function ls(argv: string[]): Promise<number> {
  const { values, positionals } = parse(argv, { state: { type: 'string', multiple: true }, json: { type: 'boolean', default: false } });
  if (positionals.length) throw new InvalidArgumentError(`torpor ls takes no arguments; got ${JSON.stringify(positionals[0])}`);
  const states = (values.state as string[] | undefined)?.flatMap((s) => s.split(','));
  for (const s of states ?? [])
    if (!(SANDBOX_STATES as readonly string[]).includes(s)) throw new InvalidArgumentError(`--state takes one of ${SANDBOX_STATES.join(', ')}; got ${JSON.stringify(s)}`);
  const all = await Sandbox.list(states ? { state: states as SandboxState[] } : {});
  if (values.json) {
    process.stdout.write(JSON.stringify(all.map(infoJson), null, 2) + '\n');
    return 0;
  }
  const now = Date.now();
  process.stdout.write(
    table([
      ['ID', 'STATE', 'TEMPLATE', 'CPU', 'MEMORY_MB', 'DISK', 'OWNER', 'CREATED', 'PAUSED'],
      ...all.map((s) => [
        s.sandboxId,
        s.state,
        s.template,
        String(s.resources.cpu),
        String(s.resources.memoryMb),
        formatBytes(s.bytesOnDisk),
        s.ownerPid === null ? '-' : `pid ${s.ownerPid}`,
        `${formatAge(now - s.createdAt.getTime())} ago`,
        s.pausedAt ? `${formatAge(now - s.pausedAt.getTime())} ago` : '-',
      ]),
    ]),
  );
  return 0;
}

async function info(argv: string[]): Promise<number> {
  const { values, positionals } = parse(argv, { json: { type: 'boolean', default: false } });
  const i = await Sandbox.getInfo(oneId('info', positionals));
  if (values.json) {
    process.stdout.write(JSON.stringify(infoJson(i), null, 2) + '\n');
    return 0;
  }
  const rows: Array<[string, string]> = [
    ['id', i.sandboxId],
    ['state', i.ownerPid !== null ? `${i.state} (owned by pid ${i.ownerPid})` : i.state],
    ['template', `${i.template}${i.createdFrom ? ` (${createdFromText(i)})` : ''}`],
    ['resources', `${i.resources.cpu} vCPUs, ${i.resources.memoryMb} MiB, disk ${i.resources.diskMb} MiB`],
    ['created', i.createdAt.toISOString()],
  ];
  if (i.pausedAt) rows.push(['paused', i.pausedAt.toISOString()]);
  if (i.resumedAt) rows.push(['resumed', `${i.resumedAt.toISOString()} from ${i.resumedFrom ?? '?'}${i.resumeReason ? ` (${i.resumeReason})` : ''}`]);
  if (i.lostInterval) rows.push(['lost', `${i.lostInterval.from.toISOString()} to ${i.lostInterval.to.toISOString()}`]);
  rows.push(['generation', String(i.generation)], ['on disk', formatBytes(i.bytesOnDisk)]);
  if (i.checkpoints) rows.push(['checkpoints', i.checkpoints.map((c) => (c.label ? `${c.id} (${c.label})` : String(c.id))).join(', ')]);
  if (i.timeoutMs !== undefined) rows.push(['idle timeout', `${i.timeoutMs} ms, then ${i.onTimeout ?? 'kill'}`]);
  for (const [k, v] of Object.entries(i.metadata)) rows.push([`metadata.${k}`, v]);
  process.stdout.write(rows.map(([k, v]) => `${`${k}:`.padEnd(14)}${v}`).join('\n') + '\n');
  return 0;
}

/** `exec ID [--user U] [--cwd DIR] [--env K=V]... [--timeout-ms N] -- PROGRAM ARGS...`: argv, no shell (as docker exec); the program's exit status becomes ours. */
async function exec(argv: string[]): Promise<number> {
  const dash = argv.indexOf('--');
  if (dash < 0 || dash === argv.length - 1) throw new InvalidArgumentError('torpor exec takes ID -- PROGRAM [ARGS...] (no shell: `-- bash -lc "..."` for one)');
  const { values, positionals } = parse(argv.slice(0, dash), {
    user: { type: 'string' },
    cwd: { type: 'string' },
    env: { type: 'string', multiple: true },
    'timeout-ms': { type: 'string' },
  });
  const id = oneId('exec', positionals);
  const cmd = argv.slice(dash + 1);
  const envs: Record<string, string> = {};
  for (const e of (values.env as string[] | undefined) ?? []) {
    const i = e.indexOf('=');
    if (i <= 0) throw new InvalidArgumentError(`--env takes KEY=VALUE; got ${JSON.stringify(e)}`);
    envs[e.slice(0, i)] = e.slice(i + 1);
  }
  const timeout = values['timeout-ms'] === undefined ? 0 : Number(values['timeout-ms']);
  if (!Number.isInteger(timeout) || timeout < 0) throw new InvalidArgumentError(`--timeout-ms takes a whole number of ms; got ${JSON.stringify(values['timeout-ms'])}`);
  return withSandbox(id, progress(false), async (sbx) => {
    try {
      const r = await sbx.commands.run(cmd, {
        ...(values.user ? { user: values.user as string } : {}),
        ...(values.cwd ? { cwd: values.cwd as string } : {}),
        envs,
        timeoutMs: timeout,
        // Bytes through unchanged: `torpor exec ID -- cat image.png > image.png` must work.
        encoding: 'buffer',
        onStdout: (d) => void process.stdout.write(d),
        onStderr: (d) => void process.stderr.write(d),
      });
      return r.exitCode;
    } catch (err) {
      if (err instanceof CommandExitError) return err.exitCode;
      throw err;
    }
  });
}

/** `shell ID [--user U]`: an interactive login shell on a pty sized like this terminal. */
async function shell(argv: string[]): Promise<number> {
  const { values, positionals } = parse(argv, { user: { type: 'string' }, cmd: { type: 'string' } });
  const id = oneId('shell', positionals);
  const stdin = process.stdin;
  return withSandbox(id, progress(false), async (sbx) => {
    const size = { cols: process.stdout.columns || 80, rows: process.stdout.rows || 24 };
    const pty = await sbx.pty.create({
      ...size,
      ...(values.user ? { user: values.user as string } : {}),
      ...(values.cmd ? { cmd: ['bash', '-lc', values.cmd as string] } : {}),
      onData: (d) => void process.stdout.write(d),
    });
    const input = (d: Buffer) => void pty.sendInput(d).catch(() => undefined);
    const resize = () => void pty.resize({ cols: process.stdout.columns || 80, rows: process.stdout.rows || 24 }).catch(() => undefined);
    if (stdin.isTTY) stdin.setRawMode(true);
    stdin.on('data', input);
    process.stdout.on('resize', resize);
    try {
      return (await pty.wait()).exitCode;
    } finally {
      stdin.off('data', input);
      process.stdout.off('resize', resize);
      if (stdin.isTTY) stdin.setRawMode(false);
      stdin.pause();
    }
  });
}

/** `logs ID PID [--from-offset N] [--timeout-ms N]`: the process's kept output, then what it prints until it ends (or the timeout, or Ctrl-C). */
async function logs(argv: string[]): Promise<number> {
  const { values, positionals } = parse(argv, { 'from-offset': { type: 'string' }, 'timeout-ms': { type: 'string' } });
  if (positionals.length !== 2) throw new InvalidArgumentError('torpor logs takes ID PID');
  const [id, pidText] = positionals as [string, string];
  const pid = Number(pidText);
  if (!Number.isInteger(pid) || pid < 1) throw new InvalidArgumentError(`PID must be a process id; got ${JSON.stringify(pidText)}`);
  const from = values['from-offset'] === undefined ? undefined : Number(values['from-offset']);
  if (from !== undefined && (!Number.isInteger(from) || from < 0)) throw new InvalidArgumentError(`--from-offset takes a byte offset; got ${JSON.stringify(values['from-offset'])}`);
  const timeout = values['timeout-ms'] === undefined ? undefined : Number(values['timeout-ms']);
  if (timeout !== undefined && (!Number.isInteger(timeout) || timeout < 1)) throw new InvalidArgumentError(`--timeout-ms takes a whole number of ms; got ${JSON.stringify(values['timeout-ms'])}`);
  return withSandbox(id, progress(false), async (sbx) => {
    const handle = await sbx.commands.connect(pid, {
      ...(from !== undefined ? { fromOffset: { stdout: from, stderr: from } } : {}),
      ...(timeout !== undefined ? { timeoutMs: timeout } : {}),
      onStdout: (d) => void process.stdout.write(d),
      onStderr: (d) => void process.stderr.write(d),
    });
    // Ctrl-C stops following; the process keeps running and the sandbox is paused again.
    const stop = () => void handle.disconnect();
    process.once('SIGINT', stop);
    try {
      const r = await handle.wait();
      return r.exitCode;
    } catch (err) {
      if (err instanceof CommandExitError) return err.exitCode;
      if (err instanceof TorporError && (err.code === 'TIMEOUT' || err.code === 'CONNECTION_CLOSED')) return 0;
      throw err;
    } finally {
      process.off('SIGINT', stop);
    }
  });
}

/** `pause ID`: a paused one stays as it is; one whose owner died is recovered and paused. */
async function pause(argv: string[]): Promise<number> {
  const { values, positionals } = parse(argv, { json: { type: 'boolean', default: false } });
  const id = oneId('pause', positionals);
  const before = await Sandbox.getInfo(id);
  if (before.state === 'paused') {
    if (values.json) process.stdout.write(JSON.stringify({ sandboxId: id, alreadyPaused: true, generation: before.generation }) + '\n');
    else process.stdout.write(`${id} is already paused (generation ${before.generation})\n`);
    return 0;
  }
  const say = progress(values.json as boolean);
  say(`recovering ${id}...`);
  const sbx = await Sandbox.connect(id);
  say(`pausing ${id}...`);
  const r = await sbx.pause();
  if (values.json) process.stdout.write(JSON.stringify({ ...r, alreadyPaused: false }) + '\n');
  else process.stdout.write(`${id} paused: generation ${r.generation}, ${formatBytes(r.bytes)} written\n`);
  return 0;
}

async function kill(argv: string[]): Promise<number> {
  const { positionals } = parse(argv, {});
  const id = oneId('kill', positionals);
  if (!(await Sandbox.kill(id))) {
    process.stderr.write(`torpor: SANDBOX_NOT_FOUND: no sandbox ${id}\n`);
    return 1;
  }
  return 0;
}

/**
 * `prune [--older-than DURATION] [--templates] [--dry-run] [--json]`: kills paused sandboxes
 * paused longer ago than DURATION (default 7d), and removes the automatic templates no sandbox
 * uses (`--templates`: your own unused templates too), fork bases nothing uses, and what creates
 * a crash interrupted left (lib/store/interrupted-create.ts) older than DURATION. Running
 * sandboxes are never touched.
 */
/** The youngest fork base `torpor prune` removes. */
const FORK_BASE_MIN_AGE_MS = 60_000;

async function prune(argv: string[]): Promise<number> {
  const { values, positionals } = parse(argv, {
    'older-than': { type: 'string', default: '7d' },
    templates: { type: 'boolean', default: false },
    'dry-run': { type: 'boolean', default: false },
    json: { type: 'boolean', default: false },
  });
  if (positionals.length) throw new InvalidArgumentError(`torpor prune takes no arguments; got ${JSON.stringify(positionals[0])}`);
  const age = parseDuration('--older-than', values['older-than'] as string);
  const dry = values['dry-run'] as boolean;
  const cutoff = Date.now() - age;
  const sandboxes: Array<{ sandboxId: string; pausedAt: string; bytesOnDisk: number }> = [];
  for (const s of await Sandbox.list({ state: 'paused' })) {
    if (!s.pausedAt || s.pausedAt.getTime() > cutoff) continue;
    // Another process may have connected since the list: Sandbox.kill refuses it (SANDBOX_BUSY), and prune goes on.
    if (!dry) {
      try {
        await Sandbox.kill(s.sandboxId);
      } catch (err) {
        if (err instanceof TorporError && err.code === 'SANDBOX_BUSY') continue;
        throw err;
      }
    }
    sandboxes.push({ sandboxId: s.sandboxId, pausedAt: s.pausedAt.toISOString(), bytesOnDisk: s.bytesOnDisk });
  }
  const templates: string[] = [];
  // Imported here: the template module brings image pulls and builds, which no other command needs.
  const { Template } = await import('../template/template.js');
  for (const t of await Template.list()) {
    if (t.dependents.length || (t.kind !== 'automatic' && !values.templates)) continue;
    if (!dry) {
      try {
        await Template.remove(t.name);
      } catch (err) {
        if (err instanceof TorporError && err.code === 'TEMPLATE_IN_USE') continue; // a sandbox was made from it meanwhile
        throw err;
      }
    }
    templates.push(t.name);
  }
  // What creates a crash interrupted left (no meta.json, no owner), as old as the paused ones
  // taken; before the fork bases, which a directory with no meta.json keeps.
  const interrupted = await pruneInterruptedCreates(cutoff, { dryRun: dry });
  // Fork bases no sandbox uses any more (a fork whose children were all killed elsewhere); not
  // one made in the last minute, which a fork in progress is about to name in its children.
  const forkBasesRemoved: string[] = [];
  for (const base of await forkBases()) {
    const made = await stat(base).then((st) => st.mtimeMs, () => Date.now());
    if (made > Date.now() - FORK_BASE_MIN_AGE_MS) continue;
    if (dry ? await forkBaseUnused(base, new Set(interrupted)) : await dropForkBaseIfUnused(base)) forkBasesRemoved.push(base);
  }
  if (values.json) process.stdout.write(JSON.stringify({ dryRun: dry, sandboxes, templates, forkBases: forkBasesRemoved, interrupted }, null, 2) + '\n');
  else {
    const verb = dry ? 'would remove' : 'removed';
    const freed = sandboxes.reduce((n, s) => n + s.bytesOnDisk, 0);
    process.stdout.write(`${verb} ${sandboxes.length} paused sandbox${sandboxes.length === 1 ? '' : 'es'} (${formatBytes(freed)}) and ${templates.length} template${templates.length === 1 ? '' : 's'}\n`);
    for (const s of sandboxes) process.stdout.write(`  ${s.sandboxId}  paused ${s.pausedAt}\n`);
    for (const t of templates) process.stdout.write(`  template ${t}\n`);
    for (const b of forkBasesRemoved) process.stdout.write(`  fork base ${b}\n`);
    for (const id of interrupted) process.stdout.write(`  ${id}  an interrupted create (no meta.json)\n`);
  }
  return 0;
}

export const SANDBOX_COMMANDS: Record<string, (argv: string[]) => Promise<number>> = { ls, list: ls, info, exec, shell, logs, pause, kill, prune };

/** How `info` says where a sandbox came from. */
function createdFromText(i: SandboxInfo): string {
  if (i.createdFrom === 'template') return 'restored from it';
  if (i.createdFrom === 'fork') return `forked from ${i.forkedFrom ?? 'another sandbox'}`;
  return `booted${i.bootReason ? `: ${i.bootReason}` : ''}`;
}
