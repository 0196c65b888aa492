// The nested host's hang check: a test whose guest hangs must fail the suite through the file
// limit, with backtraces, and never be taken for an L1 wedge and resumed (docs/nested.md, "The
// emulated machine's own failures"). Runs one Linux-guest file in the nested host with TORPOR_TEST_STOP_VCPUS=1 (every
// guest's vCPUs stop for good right after they start) and a short file limit, and checks what the
// runner and the suite said. Exit 0 when the hang was caught as it must be.
//   node --import tsx test/nested/hang-check.ts        (.ci/run runs it beside the nested suite)
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const FILE = 'vmm-linux';
const LIMIT_S = 45;
const checkout = fileURLToPath(new URL('../..', import.meta.url));

const env: NodeJS.ProcessEnv = {
  ...process.env,
  NESTED_SUITE_FILES: FILE,
  NESTED_FILE_LIMIT_S: String(LIMIT_S),
  TORPOR_TEST_STOP_VCPUS: '1',
  // One boot only: a resume would be the defect this check exists to catch, so it must show as
  // a second boot, not be allowed.
  NESTED_WEDGE_RESUMES: '1',
  NESTED_TIMEOUT_S: '900',
};
// One file only: not CI's halves of the suite.
delete env.NESTED_SUITE_PART;
const child = spawn(process.execPath, ['--import', 'tsx', 'test/nested/run.ts'], { cwd: checkout, env, stdio: ['ignore', 'pipe', 'pipe'] });
let out = '';
for (const stream of [child.stdout, child.stderr]) {
  stream.on('data', (d: Buffer) => {
    out += d.toString();
    process.stdout.write(d);
  });
}
const code = await new Promise<number>((resolve) => child.on('close', (c) => resolve(c ?? 1)));

const problems: string[] = [];
if (code !== 1) problems.push(`the run exited ${code}, not 1 (the suite failing)`);
if (!out.includes('TORPOR_TEST_STOP_VCPUS=1: this guest')) problems.push("the hook never stopped a guest's vCPUs");
if (!out.includes(`${FILE}.test.ts did not finish within ${LIMIT_S} s`)) problems.push('the file limit did not stop the file');
if (!/^Thread 1 /m.test(out)) problems.push("no backtrace of the test process");
if (/\(boot 2\)|resuming after an L1 wedge|L1 wedges: [1-9]/.test(out)) problems.push('the hang was taken for an L1 wedge and resumed');
if (/sent a BREAK/.test(out)) problems.push("L1's heartbeat stopped: a hung guest must not silence L1");
console.log(
  problems.length
    ? `\nhang check: FAIL: ${problems.join('; ')}`
    : `\nhang check: passed: a guest hung under ${FILE}.test.ts was stopped by the ${LIMIT_S} s file limit with backtraces and failed the suite; L1 kept beating, no BREAK, no resume`,
);
process.exit(problems.length ? 1 : 0);
