// The Linux suite, as run inside the nested host (npm run test:linux): every
// test file that needs KVM (the Linux-guest files and the test-guest files),
// in one uvu process, then a count of what ran. A Linux-guest test that skips
// here is a failure: on this host it must run, so the totals must show every
// registered test passed, none skipped, and each Linux file at least the tests
// it has today.
import { spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { FileClock } from './file-clock.js';
import { type SuiteState, distinctSkips, emptyState, readState, readWedges, resumeFrom, writeState } from './suite-state.js';

/** Files that boot machines through KVM. A new one belongs here (and runs on hardware hosts in npm test too):
 *  test/nested-suite.test.ts fails for a test file that can skip for lack of KVM and is missing. */
export const KVM_FILES = [
  'agent-testvm',
  'api-abort',
  'api-dispose',
  'api-e2b-shape',
  'api-e2b-linux',
  'cli-linux',
  'cli-sandbox',
  'exit-stages',
  'first-run',
  'net-linux',
  'net-linux-bulk',
  'net-linux-pause',
  'net-testvm',
  'probe',
  'sandbox-checkpoint',
  'sandbox-create',
  'sandbox-linux',
  'sandbox-linux-pause',
  'sandbox-linux-template',
  'sandbox-net-pause',
  'sandbox-pause',
  'sandbox-template',
  'sandbox-testvm',
  'template-linux',
  'vmm-boot',
  'vmm-devices',
  'vmm-exhaustion',
  'vmm-kernel-load',
  'vmm-lifecycle',
  'vmm-linux',
  'vmm-linux-snapshot',
  'vmm-options',
  'vmm-restore-pool',
  'vmm-seccomp',
  'vmm-snapshot',
  'vmm-testvm',
];

/** The files CI runs in a second L1 (NESTED_SUITE_PART=side) on the core that the soak and the
 *  hang check free once they are done, while the first L1 runs the others
 *  (NESTED_SUITE_PART=main): the machine-level files, exit-stages, net-linux-bulk,
 *  sandbox-template and sandbox-linux-pause. In one L1 the whole suite outgrew CI's budget on a host without /dev/kvm
 *  (past 2,700 s, still in vmm-snapshot, 2026-12-06). Planned from the times the suite prints (a
 *  clean-clone .ci/run on a 2-core host without /dev/kvm, 2026-12-06): the vmm- files 666 s, fuzz,
 *  the soak and the hang check 967 s before them; the main part 2,388 s with the two last named
 *  (186 s and 190 s) in it, which ended 700 s after the side. net-linux-bulk moved over after a
 *  clean-clone run on a PVM host (2026-12-07) whose main part (3,246 s) ended 609 s after the
 *  side, with net-linux-bulk's 332 s in it. sandbox-linux-pause (379 s) moved back to the main part
 *  once the CLI tests there started the compiled CLI (cli-sandbox from 840 s to 211 s): planned
 *  from that run (1fbeb79), both parts were to end about 4,600-4,700 s into CI's 5,400. The
 *  clean-clone run of that split (ec36d86, 2026-12-07) ended the side at 4,818 s and the main
 *  part at 5,091 s: first-run took 928 s, not 444, run beside the soak, whose 20 threads at
 *  nice 10 took much of the main L1's core (the soak is at nice 19 since), and sandbox-template
 *  (126 s there; 131 s alone in the nested host) moved to the side, which had ended 273 s
 *  sooner. The next run (3a67cb0) ended the main part 77 s under its L1's limit (3,352 s) and
 *  ran out of time in the side's (2,431 s; the side L1 had started 2,671 s into CI, after fuzz,
 *  the soak and the hang check): fuzz now runs beside the README's commands, so the side L1
 *  starts some 500 s sooner, and sandbox-linux-pause (363 s) went back to the side. L1 itself
 *  keeps one CPU (NESTED_SMP). */
export const SIDE_FILES = KVM_FILES.filter(
  (f) => f.startsWith('vmm-') || ['exit-stages', 'net-linux-bulk', 'sandbox-template', 'sandbox-linux-pause'].includes(f),
);
const SUITE_PARTS: Record<string, readonly string[]> = {
  main: KVM_FILES.filter((f) => !SIDE_FILES.includes(f)),
  side: SIDE_FILES,
};

/** The Linux-guest files and how many tests each has today: fewer passing is a failure. */
export const LINUX_FILES: Record<string, number> = {
  'vmm-linux': 1,
  'cli-linux': 1,
  'vmm-linux-snapshot': 2,
  'sandbox-linux': 4,
  'sandbox-linux-pause': 5,
  'sandbox-linux-template': 1,
  'api-e2b-linux': 3,
  'net-linux': 4,
  'net-linux-bulk': 1,
  'net-linux-pause': 1,
  'template-linux': 4,
  'first-run': 3,
};

const ANSI = /\x1b\[[0-9;]*m/g;
/** How long the test process may stay alive after printing its totals. */
const LINGER_MS = 20_000;
/** How long one test file may run before it counts as hung (NESTED_FILE_LIMIT_S). The slowest
 *  file took 197 s in a 967 s suite here (vmm-snapshot, 2026-12-02); by 2026-12-07 files had
 *  grown, and in a clean-clone CI run on a PVM host sandbox-pause took 557 s, template-linux
 *  463 s and vmm-linux-snapshot 416 s against the 600 s this was then: a limit that close
 *  measures the emulator, not a hang. Every wait in them is bounded well below this, so a file
 *  past it waits on something unbounded. Stopping it there, with a backtrace of the test
 *  process, says where, and leaves CI's budget for the rest of the run instead of spending it
 *  on L1's overall timeout. */
const FILE_LIMIT_S = Number(process.env.NESTED_FILE_LIMIT_S ?? 900);
/** Files whose own work in the emulator is long, bounded by the waits inside them: first-run
 *  builds a base image, pushes it to a registry, packs torpor and installs it as another user,
 *  all inside L1 (its fixtures alone took 76 s on the host and 425 s in L1 beside CI's soak:
 *  604 s in all, 690 s on 2026-12-07). cli-sandbox runs `torpor` 16 times, each a Node start
 *  loading lib/ through tsx (0.9 s on the host, tens of seconds in L1), each bounded
 *  by its own 180 s: 541 s and 597 s in two clean-clone CI runs, and still in its second test at
 *  600 s in a third (2026-12-07). Twice the limit, unless NESTED_FILE_LIMIT_S names one for
 *  every file. */
const LONG_FILES: Record<string, number> = { 'first-run': 2, 'cli-sandbox': 2 };
export function fileLimitS(file: string): number {
  return process.env.NESTED_FILE_LIMIT_S ? FILE_LIMIT_S : FILE_LIMIT_S * (LONG_FILES[file] ?? 1);
}
/** How often the suite says which file it is in, so a silent stretch of the log still shows L1 alive. */
const HEARTBEAT_S = 300;

export interface UvuTotals {
  total: number;
  passed: number;
  skipped: number;
  /** Per file: passed and total, from uvu's "(passed / total)" line under the file's name. */
  files: Map<string, { passed: number; total: number }>;
}

export function parseUvu(output: string): UvuTotals | undefined {
  const text = output.replace(ANSI, '');
  const num = (label: string): number | undefined => {
    const m = new RegExp(`^\\s*${label}:\\s+(\\d+)`, 'm').exec(text);
    return m ? Number(m[1]) : undefined;
  };
  const total = num('Total');
  const passed = num('Passed');
  const skipped = num('Skipped');
  if (total === undefined || passed === undefined || skipped === undefined) return undefined;
  // The files' counts as the suite's file clock reads them while the run goes on (one parser).
  const clock = new FileClock();
  clock.feed(`${text}\n`, 0);
  return { total, passed, skipped, files: new Map(clock.done.map((f) => [f.name, { passed: f.passed, total: f.total }])) };
}

/** What is wrong with a run's totals, or an empty list. `expected`: the files that had to run. */
export function checkTotals(t: UvuTotals, expected: readonly string[] = KVM_FILES): string[] {
  const problems: string[] = [];
  if (t.skipped !== 0) problems.push(`${t.skipped} test(s) skipped: on the nested host every KVM test must run`);
  if (t.passed !== t.total) problems.push(`${t.total - t.passed} of ${t.total} test(s) failed`);
  for (const name of expected) if (!t.files.has(name)) problems.push(`${name}.test.ts did not report`);
  for (const [name, min] of Object.entries(LINUX_FILES)) {
    const f = expected.includes(name) ? t.files.get(name) : undefined;
    if (f && (f.passed < min || f.passed !== f.total)) problems.push(`${name}.test.ts: ${f.passed} of ${f.total} passed, expected at least ${min}`);
  }
  return problems;
}

/** The totals of this boot's uvu run with those of files an earlier, wedged boot finished. Skips
 *  are not per file here: uvu leaves them out of a file's counts (see distinctSkips). */
export function withEarlierFiles(t: UvuTotals, earlier: SuiteState): UvuTotals {
  const files = new Map(t.files);
  let { total, passed } = t;
  for (const [name, f] of Object.entries(earlier.files)) {
    files.set(name, { passed: f.passed, total: f.total });
    total += f.total;
    passed += f.passed;
  }
  return { total, passed, skipped: t.skipped, files };
}

/**
 * Brings `state` up to what the clock has read: the files that finished since `from` (an index
 * into clock.done) with their counts, the file running now and whether one of its tests failed.
 * Whether anything changed, so the caller writes the state only then.
 */
export function noteProgress(state: SuiteState, clock: FileClock, from: number): boolean {
  const runningFailed = clock.current !== undefined && clock.currentFailed;
  const changed = clock.done.length !== from || state.running !== clock.current || state.runningFailed !== runningFailed;
  for (const f of clock.done.slice(from)) state.files[f.name] = { passed: f.passed, total: f.total };
  state.running = clock.current;
  state.runningFailed = runningFailed;
  return changed;
}

/** The files this run is to cover: NESTED_SUITE_FILES (comma-separated, for a quicker run by
 *  hand, each one of KVM_FILES), NESTED_SUITE_PART (main or side: CI's two L1s, SUITE_PARTS), or
 *  all of KVM_FILES. */
export function selectedFiles(env: NodeJS.ProcessEnv = process.env): readonly string[] {
  const asked = env.NESTED_SUITE_FILES;
  const part = env.NESTED_SUITE_PART;
  if (asked !== undefined && part !== undefined) throw new Error('NESTED_SUITE_FILES and NESTED_SUITE_PART: one or the other');
  if (part !== undefined) {
    const files = SUITE_PARTS[part];
    if (!files) throw new Error(`NESTED_SUITE_PART=${part}: one of ${Object.keys(SUITE_PARTS).join(', ')}`);
    return files;
  }
  if (asked === undefined) return KVM_FILES;
  const files = asked.split(',').map((f) => f.trim()).filter(Boolean);
  if (files.length === 0) throw new Error(`NESTED_SUITE_FILES='${asked}' names no file`);
  const unknown = files.filter((f) => !KVM_FILES.includes(f));
  if (unknown.length) throw new Error(`NESTED_SUITE_FILES: not KVM test files: ${unknown.join(', ')}`);
  return files;
}

async function main(): Promise<number> {
  const files = selectedFiles();
  // Set by test/nested/run.ts for the suite: where the suite keeps what it finished across L1
  // boots, and where the runner notes each wedge it ended (with the file it interrupted).
  const statePath = process.env.NESTED_SUITE_STATE;
  const wedges = process.env.NESTED_WEDGE_LOG ? readWedges(process.env.NESTED_WEDGE_LOG) : [];
  const earlier = statePath ? resumeFrom(readState(statePath)) : emptyState();
  const state: SuiteState = { files: { ...earlier.files }, failedBeforeWedge: earlier.failedBeforeWedge };
  const toRun = files.filter((f) => !(f in state.files));
  if (files.length !== KVM_FILES.length) {
    const which = process.env.NESTED_SUITE_PART ? `NESTED_SUITE_PART=${process.env.NESTED_SUITE_PART}` : 'NESTED_SUITE_FILES';
    console.log(`nested suite: ${which}: ${files.length} of the suite's ${KVM_FILES.length} files only`);
  }
  if (wedges.length) {
    const last = wedges.at(-1);
    console.log(
      `nested suite: resuming after an L1 wedge ${last ? `in ${last}.test.ts` : 'before or between files'} ` +
        `(wedge ${wedges.length}; docs/nested.md, "The emulated machine's own failures"): ${files.length - toRun.length} file(s) that finished before it ` +
        `keep their counts; running the other ${toRun.length}` +
        (last && toRun.includes(last) ? `, ${last} again from its start` : ''),
    );
  }
  // Skips across boots: the suite's own skip log in the run directory (test/skip-unless.ts).
  const skipLog = statePath ? `${statePath}.skips` : undefined;
  const save = (): void => {
    if (statePath) writeState(statePath, state);
  };
  save();
  const finish = (t: UvuTotals, seconds: number, code: number, ran: boolean): number => {
    const merged = withEarlierFiles(t, earlier);
    if (skipLog) merged.skipped = Math.max(merged.skipped, distinctSkips(skipLog));
    return report(merged, files, state.failedBeforeWedge, wedges, seconds, code, ran);
  };
  if (toRun.length === 0) return finish({ total: 0, passed: 0, skipped: 0, files: new Map() }, 0, 0, false);

  const pattern = `^(${toRun.join('|')})\\.test\\.ts$`;
  const started = performance.now();
  const child = spawn(process.execPath, ['--import', 'tsx', 'node_modules/uvu/bin.js', 'test', pattern], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: skipLog ? { ...process.env, TORPOR_SKIP_LOG: skipLog } : process.env,
  });
  let output = '';
  let lingering: NodeJS.Timeout | undefined;
  let killedLingering = false;
  const clock = new FileClock();
  let hung: string | undefined;
  let lastBeat = performance.now();
  const watch = setInterval(() => {
    const now = performance.now();
    const inFile = clock.runningFor(now);
    if (!hung && clock.current && inFile > fileLimitS(clock.current)) {
      hung = clock.current;
      console.log(`\nnested suite: ${hung}.test.ts has run ${inFile.toFixed(0)} s (its limit ${fileLimitS(hung)} s, NESTED_FILE_LIMIT_S): hung; what the processes were doing:`);
      describeHang(child.pid!);
      child.kill('SIGKILL');
    } else if (now - lastBeat > HEARTBEAT_S * 1000) {
      lastBeat = now;
      const where = clock.current ? `in ${clock.current}.test.ts for ${inFile.toFixed(0)} s` : 'between files';
      console.log(`\nnested suite: ${((now - started) / 1000).toFixed(0)} s, ${where}`);
    }
  }, 5_000);
  child.stdout.on('data', (d: Buffer) => {
    output += d.toString();
    const finished = clock.done.length;
    clock.feed(d.toString(), performance.now());
    // Written before the chunk is shown: a wedge after it shows nothing the state does not know.
    if (statePath && noteProgress(state, clock, finished)) save();
    process.stdout.write(d);
    // Each file's time as it ends: CI's budget is planned from these, and a run L1's timeout
    // ends never reaches the slowest-files line below.
    for (const f of clock.done.slice(finished)) {
      console.log(`nested suite: ${f.name}.test.ts took ${f.seconds.toFixed(0)} s (${((performance.now() - started) / 1000).toFixed(0)} s into the run)`);
    }
    // uvu printed its totals: every test is done. A process that stays alive
    // after that holds a timer or a handle a test left behind; it costs CI
    // minutes, not correctness, so it is ended and reported, not waited for.
    if (!lingering && /Duration:/.test(output.replace(ANSI, ''))) {
      lingering = setTimeout(() => {
        killedLingering = true;
        child.kill('SIGKILL');
      }, LINGER_MS);
    }
  });
  const code = await new Promise<number>((resolve) => child.on('close', (c, signal) => resolve(c ?? (signal ? 128 : 1))));
  clearTimeout(lingering);
  clearInterval(watch);
  if (killedLingering) {
    console.log(
      `\nnested suite: WARNING: the test process was still alive ${LINGER_MS / 1000} s after its totals ` +
        '(a timer or handle left open by a test); ended it',
    );
  }
  const seconds = ((performance.now() - started) / 1000).toFixed(0);
  if (clock.done.length) console.log(`\nnested suite: slowest files: ${clock.slowest(6)}`);
  if (hung) {
    console.log(`nested suite: FAIL: ${hung}.test.ts did not finish within ${fileLimitS(hung)} s; the test process was killed after ${seconds} s`);
    return 1;
  }
  const totals = parseUvu(output);
  if (!totals) {
    console.log(`\nnested suite: uvu printed no totals (exit ${code}) after ${seconds} s`);
    return code || 1;
  }
  state.running = undefined;
  state.runningFailed = undefined;
  save();
  return finish(totals, Number(seconds), killedLingering ? 0 : code, true);
}

/** Prints the suite's result line and its problems; the suite's exit status. */
function report(
  totals: UvuTotals,
  files: readonly string[],
  failedBeforeWedge: string[],
  wedges: string[],
  seconds: number,
  code: number,
  ran: boolean,
): number {
  const problems = checkTotals(totals, files);
  for (const f of failedBeforeWedge) problems.push(`${f}.test.ts: a test failed before a wedge interrupted it (its rerun does not undo that)`);
  const linux = Object.keys(LINUX_FILES)
    .filter((n) => files.includes(n))
    .map((n) => `${n} ${totals.files.get(n)?.passed ?? 0}/${totals.files.get(n)?.total ?? 0}`)
    .join(', ');
  const resumed = wedges.length
    ? `; resumed after ${wedges.length} L1 wedge(s), in ${wedges.map((w) => (w ? `${w}.test.ts` : 'no file')).join(', ')}`
    : '';
  console.log(
    `\nnested suite: ${totals.passed} passed, ${totals.skipped} skipped of ${totals.total} in ${files.length} files${linux ? ` (${linux})` : ''} in ${seconds} s${ran ? '' : ' (nothing left to run)'}${resumed}`,
  );
  for (const p of problems) console.log(`nested suite: FAIL: ${p}`);
  if (problems.length) return 1;
  return code;
}

/** Prints what the hung test process and its children are doing: their states and kernel wait
 *  channels, and every thread's backtrace of the test process (gdb, read-only from the host's root). */
function describeHang(pid: number): void {
  const ps = spawnSync('ps', ['-e', '--forest', '-o', 'pid,stat,wchan:24,etime,rss,args'], { encoding: 'utf8', timeout: 30_000 });
  console.log(ps.stdout ?? `(ps failed: ${ps.error})`);
  const gdb = spawnSync('gdb', ['-p', String(pid), '-batch', '-nx', '-ex', 'thread apply all bt 25'], {
    encoding: 'utf8',
    timeout: 180_000,
    maxBuffer: 16 << 20,
  });
  const bt = (gdb.stdout ?? '').split('\n').filter((l) => /^(Thread|#)/.test(l));
  console.log(bt.length ? bt.join('\n') : `(no backtrace: gdb ${gdb.error ?? `exit ${gdb.status}: ${(gdb.stderr ?? '').slice(-300)}`})`);
}

// Run as a script (inside L1); imported by test/nested-suite.test.ts for its parser.
if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) process.exit(await main());
