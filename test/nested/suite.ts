// The Linux suite, as run inside the nested host (npm run test:linux): every
// test file that needs KVM (the Linux-guest files and the test-guest files),
// in one uvu process, then a count of what ran. A Linux-guest test that skips
// here is a failure: on this host it must run, so the totals must show every
// registered test passed, none skipped, and each Linux file at least the tests
// it has today.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

/** Files that boot machines through KVM. A new one belongs here (and runs on hardware hosts in npm test too). */
export const KVM_FILES = [
  'agent-testvm',
  'api-e2b-linux',
  'exit-stages',
  'net-linux',
  'net-linux-bulk',
  'net-linux-pause',
  'net-testvm',
  'probe',
  'sandbox-create',
  'sandbox-linux',
  'sandbox-linux-pause',
  'sandbox-linux-template',
  'sandbox-net-pause',
  'sandbox-pause',
  'sandbox-template',
  'sandbox-testvm',
  'vmm-boot',
  'vmm-devices',
  'vmm-kernel-load',
  'vmm-lifecycle',
  'vmm-linux',
  'vmm-linux-snapshot',
  'vmm-options',
  'vmm-restore-pool',
  'vmm-snapshot',
  'vmm-testvm',
];

/** The Linux-guest files and how many tests each has today: fewer passing is a failure. */
export const LINUX_FILES: Record<string, number> = {
  'vmm-linux': 1,
  'vmm-linux-snapshot': 2,
  'sandbox-linux': 2,
  'sandbox-linux-pause': 4,
  'sandbox-linux-template': 1,
  'api-e2b-linux': 1,
  'net-linux': 3,
  'net-linux-bulk': 1,
  'net-linux-pause': 1,
};

const ANSI = /\x1b\[[0-9;]*m/g;
/** How long the test process may stay alive after printing its totals. */
const LINGER_MS = 20_000;

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
  const files = new Map<string, { passed: number; total: number }>();
  let current: string | undefined;
  for (const line of text.split('\n')) {
    const name = /^(\S+)\.test\.ts\s*$/.exec(line);
    if (name) current = name[1];
    const counts = /\((\d+) \/ (\d+)\)\s*$/.exec(line);
    if (counts && current) {
      files.set(current, { passed: Number(counts[1]), total: Number(counts[2]) });
      current = undefined;
    }
  }
  return { total, passed, skipped, files };
}

/** What is wrong with a run's totals, or an empty list. */
export function checkTotals(t: UvuTotals): string[] {
  const problems: string[] = [];
  if (t.skipped !== 0) problems.push(`${t.skipped} test(s) skipped: on the nested host every KVM test must run`);
  if (t.passed !== t.total) problems.push(`${t.total - t.passed} of ${t.total} test(s) failed`);
  for (const name of KVM_FILES) if (!t.files.has(name)) problems.push(`${name}.test.ts did not report`);
  for (const [name, min] of Object.entries(LINUX_FILES)) {
    const f = t.files.get(name);
    if (f && (f.passed < min || f.passed !== f.total)) problems.push(`${name}.test.ts: ${f.passed} of ${f.total} passed, expected at least ${min}`);
  }
  return problems;
}

async function main(): Promise<number> {
  const pattern = `^(${KVM_FILES.join('|')})\\.test\\.ts$`;
  const started = performance.now();
  const child = spawn(process.execPath, ['--import', 'tsx', 'node_modules/uvu/bin.js', 'test', pattern], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let output = '';
  let lingering: NodeJS.Timeout | undefined;
  let killedLingering = false;
  child.stdout.on('data', (d: Buffer) => {
    output += d.toString();
    process.stdout.write(d);
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
  if (killedLingering) {
    console.log(
      `\nnested suite: WARNING: the test process was still alive ${LINGER_MS / 1000} s after its totals ` +
        '(a timer or handle left open by a test); ended it',
    );
  }
  const seconds = ((performance.now() - started) / 1000).toFixed(0);
  const totals = parseUvu(output);
  if (!totals) {
    console.log(`\nnested suite: uvu printed no totals (exit ${code}) after ${seconds} s`);
    return code || 1;
  }
  const problems = checkTotals(totals);
  const linux = Object.keys(LINUX_FILES)
    .map((n) => `${n} ${totals.files.get(n)?.passed ?? 0}/${totals.files.get(n)?.total ?? 0}`)
    .join(', ');
  console.log(
    `\nnested suite: ${totals.passed} passed, ${totals.skipped} skipped of ${totals.total} in ${KVM_FILES.length} files (${linux}) in ${seconds} s`,
  );
  for (const p of problems) console.log(`nested suite: FAIL: ${p}`);
  if (problems.length) return 1;
  return killedLingering ? 0 : code;
}

// Run as a script (inside L1); imported by test/nested-suite.test.ts for its parser.
if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) process.exit(await main());
