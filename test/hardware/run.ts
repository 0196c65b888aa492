// Runs inside an unpacked hardware bundle (test/hardware/bundle.ts), as run.js:
// seeds a fresh TORPOR_HOME with the bundled kernel, root filesystem and agent
// (keyed for this host, so nothing is rebuilt and nothing is downloaded), runs
// the Linux-guest suite and then the other KVM test files, each in its own uvu
// process, under one time limit, and writes results.json (and each file's log)
// to the results folder.
//
//   node torpor-hw/test/hardware/run.js RESULTS_DIR [--limit-s 450] [--linux-only]
import { spawn } from 'node:child_process';
import { existsSync, link, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { copyFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { parseArgs } from 'node:util';

import { ensureAgent } from '../../lib/setup/agent.js';
import { BASE_FILES, ROOTFS_FILES, baseInputs, rootfsInputs } from '../../lib/setup/rootfs.js';
import { ensureArtifact } from '../../lib/store/artifact.js';
import { homeLayout } from '../../lib/store/home.js';
import { readSkipLog, type SkipRecord } from '../skip-unless.js';
import { KVM_FILES as NESTED_KVM_FILES, LINUX_FILES } from '../nested/suite.js';

/** The Linux-guest suite: every Linux-level test file, the nested suite's list (one list for both). */
export const LINUX_SUITE = Object.keys(LINUX_FILES);
/** The other KVM test files (the test guest and the sandbox layer over it): they run on any KVM
 *  host, hardware included. Those that start fixtures through tsx find it in the bundle. */
export const KVM_FILES = NESTED_KVM_FILES.filter((f) => !(f in LINUX_FILES));

const BUNDLE = join(import.meta.dirname, '..', '..');

interface FileResult {
  file: string;
  suite: 'linux-guest' | 'kvm';
  status: 'passed' | 'failed' | 'skipped' | 'not-run';
  passed: number;
  failed: number;
  skipped: number;
  total: number;
  durationMs: number;
  exitCode: number | null;
  /** Why tests were skipped (from test/skip-unless.ts), or why the file did not run. */
  reasons: string[];
  log: string;
}

const linkFile = promisify(link);

/** The runner's own progress lines (a report of the run, not test output). */
function say(line: string): void {
  process.stdout.write(line + '\n');
}

/** The same file under a second name: a hard link where possible (no copy of 500 MiB), else a copy. */
async function place(src: string, dest: string): Promise<void> {
  try {
    await linkFile(src, dest);
  } catch {
    await copyFile(src, dest);
  }
}

/**
 * Puts the bundled image into this host's store under the keys setup computes
 * here (the base image's key covers this host's apt state, so it differs from the
 * packing host's). The image already holds the agent, so it stands in for the
 * Debian base too: nothing is left for setup to build.
 */
async function seedStore(root: string, art: string): Promise<void> {
  const agent = await ensureAgent(root, false, join(art, 'torpor-agent'));
  const base = await ensureArtifact(
    {
      kind: 'rootfs-base',
      inputs: await baseInputs(),
      files: BASE_FILES,
      build: async (dir) => {
        await place(join(art, 'rootfs.ext4'), join(dir, 'base.ext4'));
        await copyFile(join(art, 'packages.txt'), join(dir, 'packages.txt'));
      },
    },
    { root },
  );
  await ensureArtifact(
    {
      kind: 'rootfs',
      inputs: await rootfsInputs(base.key, agent.sha256),
      files: ROOTFS_FILES,
      build: async (dir) => {
        await place(join(art, 'rootfs.ext4'), join(dir, 'rootfs.ext4'));
        await copyFile(join(art, 'packages.txt'), join(dir, 'packages.txt'));
      },
    },
    { root },
  );
}

/** uvu's summary numbers from a run's output (colours off). */
function summary(out: string): { total: number; passed: number; skipped: number } | null {
  const m = /Total:\s+(\d+)\s+Passed:\s+(\d+)\s+Skipped:\s+(\d+)/.exec(out);
  return m ? { total: Number(m[1]), passed: Number(m[2]), skipped: Number(m[3]) } : null;
}

function runFile(file: string, env: NodeJS.ProcessEnv, limitMs: number): Promise<{ out: string; code: number | null; ms: number; timedOut: boolean }> {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const child = spawn(process.execPath, [join(BUNDLE, 'node_modules', 'uvu', 'bin.js'), '-c', 'false', 'test', `^${file}\\.test\\.js$`], {
      cwd: BUNDLE,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (out += d.toString()));
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, limitMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ out, code, ms: Date.now() - t0, timedOut });
    });
  });
}

async function main(): Promise<number> {
  const { values, positionals } = parseArgs({
    options: { 'limit-s': { type: 'string', default: '450' }, 'linux-only': { type: 'boolean', default: false } },
    allowPositionals: true,
  });
  const results = positionals[0];
  if (!results) {
    console.error('usage: run.js RESULTS_DIR [--limit-s 450] [--linux-only]');
    return 2;
  }
  mkdirSync(results, { recursive: true });
  const started = Date.now();
  const deadline = started + Number(values['limit-s']) * 1000;
  const art = join(BUNDLE, 'artifacts');
  const home = join(BUNDLE, 'home');
  const skipLog = join(results, 'skips.jsonl');
  writeFileSync(skipLog, '');
  // Everything the library and the tests look up comes from the bundle.
  process.env.TORPOR_HOME = home;
  const { tryProbeHost } = await import('../../lib/host/probe.js');
  const probed = tryProbeHost();
  const host = 'probe' in probed ? probed.probe : { error: { code: probed.error.code, message: probed.error.message } };
  const hardware = 'probe' in probed && probed.probe.hostKind === 'hardware';
  const linuxRunnable = hardware
    ? { ok: true as const }
    : { ok: false as const, reason: 'probe' in probed ? `host kind ${probed.probe.hostKind}: no hardware virtualization` : `no KVM: ${probed.error.message}` };
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    TORPOR_HOME: home,
    TORPOR_AGENT: join(art, 'torpor-agent'),
    TORPOR_SKIP_LOG: skipLog,
    FORCE_COLOR: '0',
  };
  // Our kernel, supplied as such (its store key would need the kernel sources). Only where it
  // can boot: on a PVM host TORPOR_KERNEL means "a kernel for this host's PVM", and the Linux
  // suite must report itself not runnable there instead.
  if (hardware) env.TORPOR_KERNEL = join(art, 'vmlinux');
  else delete env.TORPOR_KERNEL;
  say(`host: ${'probe' in probed ? probed.probe.hostKind : 'no KVM'}; Linux-guest suite ${linuxRunnable.ok ? 'runnable' : `not runnable here (${linuxRunnable.reason})`}`);

  let seedError: string | undefined;
  try {
    await seedStore(homeLayout(home).artifacts, art);
  } catch (err) {
    seedError = (err as Error).message;
    say(`seeding TORPOR_HOME failed: ${seedError}`);
  }

  const files: FileResult[] = [];
  const plan = [...LINUX_SUITE.map((f) => [f, 'linux-guest'] as const), ...(values['linux-only'] ? [] : KVM_FILES.map((f) => [f, 'kvm'] as const))];
  for (const [file, suite] of plan) {
    const log = join(results, `${file}.log`);
    const base: FileResult = { file, suite, status: 'not-run', passed: 0, failed: 0, skipped: 0, total: 0, durationMs: 0, exitCode: null, reasons: [], log };
    const left = deadline - Date.now();
    if (seedError) {
      files.push({ ...base, reasons: [`the store could not be seeded: ${seedError}`] });
      continue;
    }
    if (!existsSync(join(BUNDLE, 'test', `${file}.test.js`))) {
      files.push({ ...base, reasons: ['not in this bundle'] });
      continue;
    }
    if (left < 5000) {
      files.push({ ...base, reasons: ['the time limit was reached before it started'] });
      continue;
    }
    const before = readSkipLog(skipLog).length;
    const r = await runFile(file, env, left);
    writeFileSync(log, r.out);
    const skips: SkipRecord[] = readSkipLog(skipLog).slice(before);
    const s = summary(r.out);
    const total = s?.total ?? 0;
    const passed = s?.passed ?? 0;
    const skipped = s?.skipped ?? skips.length;
    const failed = r.code === 0 ? 0 : Math.max(1, total - passed);
    const status = r.code !== 0 || r.timedOut ? 'failed' : passed === 0 && skipped > 0 ? 'skipped' : 'passed';
    const reasons = [...new Set(skips.map((k) => `[${k.category}] ${k.reason}`))];
    if (r.timedOut) reasons.push(`killed at the time limit after ${(r.ms / 1000).toFixed(0)} s`);
    files.push({ ...base, status, passed, failed, skipped, total, durationMs: r.ms, exitCode: r.code, reasons });
    say(`${file}: ${status} (${passed}/${total} passed, ${skipped} skipped) in ${(r.ms / 1000).toFixed(1)} s${reasons.length ? ` -- ${reasons.join('; ')}` : ''}`);
  }

  const linux = files.filter((f) => f.suite === 'linux-guest');
  const linuxSkipped = linux.filter((f) => f.status === 'skipped' || f.skipped > 0 || f.status === 'not-run');
  const failedFiles = files.filter((f) => f.status === 'failed');
  // On a hardware host every Linux-guest test must run; elsewhere they are expected to skip.
  const ok = failedFiles.length === 0 && (!linuxRunnable.ok || linuxSkipped.length === 0);
  const bundle = JSON.parse(readFileSync(join(BUNDLE, 'bundle.json'), 'utf8')) as object;
  const report = {
    ok,
    startedAt: new Date(started).toISOString(),
    durationMs: Date.now() - started,
    limitS: Number(values['limit-s']),
    node: process.version,
    host,
    linuxRunnable,
    bundle,
    files,
    skips: readSkipLog(skipLog),
  };
  writeFileSync(join(results, 'results.json'), JSON.stringify(report, null, 2) + '\n');
  say(`results: ${join(results, 'results.json')} (${ok ? 'ok' : 'NOT ok'}: ${failedFiles.length} file(s) failed, ${linuxSkipped.length} Linux-guest file(s) skipped)`);
  return ok ? 0 : 1;
}

process.exitCode = await main();
