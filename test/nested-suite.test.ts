// The nested suite's count check (test/nested/suite.ts) against uvu's real
// output format: a skipped or missing Linux-guest test must fail the suite.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { FileClock } from './nested/file-clock.js';
import { distinctSkips, emptyState, readState, resumeFrom, writeState } from './nested/suite-state.js';
import { KVM_FILES, LINUX_FILES, checkTotals, noteProgress, parseUvu, selectedFiles, withEarlierFiles } from './nested/suite.js';

const ESC = '\x1b';
function uvuOutput(files: Record<string, [number, number]>, skipped: number): string {
  let out = '';
  let total = 0;
  let passed = 0;
  for (const [name, [p, t]] of Object.entries(files)) {
    out += `${ESC}[1m${ESC}[4m${ESC}[37m${name}.test.ts${ESC}[22m${ESC}[24m${ESC}[39m\n`;
    out += `${ESC}[90m• ${ESC}[39m`.repeat(t) + `${ESC}[32m  (${p} / ${t})\n${ESC}[39m\n`;
    total += t;
    passed += p;
  }
  return out + `  Total:     ${total}${ESC}[32m\n  Passed:    ${passed}${ESC}[39m\n  Skipped:   ${ESC}[33m${skipped}${ESC}[39m\n  Duration:  5992.39ms\n`;
}

const allFiles = (): Record<string, [number, number]> =>
  Object.fromEntries(KVM_FILES.map((f) => [f, [LINUX_FILES[f] ?? 3, LINUX_FILES[f] ?? 3]]));

test('a run where everything passed and nothing skipped is accepted', () => {
  const t = parseUvu(uvuOutput(allFiles(), 0))!;
  assert.ok(t);
  assert.is(t.skipped, 0);
  assert.equal(t.files.get('sandbox-linux'), { passed: LINUX_FILES['sandbox-linux'], total: LINUX_FILES['sandbox-linux'] });
  assert.equal(checkTotals(t), []);
});

test('a skipped Linux file (0 / 0 and Skipped: 1) fails the suite, naming it', () => {
  const files = allFiles();
  files['vmm-linux'] = [0, 0];
  const problems = checkTotals(parseUvu(uvuOutput(files, 1))!);
  assert.ok(problems.some((p) => p.includes('1 test(s) skipped')));
  assert.ok(problems.some((p) => p.startsWith('vmm-linux.test.ts: 0 of 0 passed')));
});

test('a failed test, a missing file and no totals at all are each caught', () => {
  const files = allFiles();
  files['sandbox-linux'] = [1, 2];
  delete files['vmm-boot'];
  const problems = checkTotals(parseUvu(uvuOutput(files, 0))!);
  assert.ok(problems.some((p) => p.includes('1 of')));
  assert.ok(problems.includes('vmm-boot.test.ts did not report'));
  assert.is(parseUvu('FAIL  "x"\n   Error: boom\n'), undefined);
});

test("the file clock follows uvu's output in chunks split anywhere: the file running, for how long, and each finished one", () => {
  const out = uvuOutput({ 'agent-testvm': [1, 1], 'net-linux-bulk': [1, 1] }, 0);
  const cut = out.indexOf('net-linux-bulk') + 4; // a chunk ends inside the second file's name
  const clock = new FileClock();
  clock.feed(out.slice(0, cut), 1_000);
  assert.is(clock.current, undefined, 'the first file ended; the second name is not complete yet');
  assert.equal(clock.done, [{ name: 'agent-testvm', seconds: 0, passed: 1, total: 1 }]);
  const secondEnds = out.indexOf('(1 / 1)', cut);
  clock.feed(out.slice(cut, secondEnds), 2_000);
  assert.is(clock.current, 'net-linux-bulk');
  assert.is(clock.runningFor(902_000), 900);
  clock.feed(out.slice(secondEnds), 62_000);
  assert.is(clock.current, undefined);
  assert.is(clock.runningFor(99_000), 0);
  assert.is(clock.slowest(1), 'net-linux-bulk 60 s');
});

test('after a wedge: the files an earlier boot finished keep their counts, the one it hit runs again, and the totals add up', () => {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-suite-state-'));
  try {
    const path = join(dir, 'suite-state.json');
    // Boot 1, read in chunks cut anywhere: two files finish (one with a failed test), a third starts.
    const first = uvuOutput({ 'agent-testvm': [1, 1], 'vmm-linux': [0, 1] }, 0).replace(/  Total:[^]*$/, '') + 'net-linux-bulk.test.ts\n• • ';
    const state = emptyState();
    const clock = new FileClock();
    for (let at = 0; at < first.length; at += 7) {
      const from = clock.done.length;
      clock.feed(first.slice(at, at + 7), at);
      if (noteProgress(state, clock, from)) writeState(path, state);
    }
    assert.equal(readState(path).files, { 'agent-testvm': { passed: 1, total: 1 }, 'vmm-linux': { passed: 0, total: 1 } });
    assert.is(readState(path).running, 'net-linux-bulk');
    assert.is(readState(path).runningFailed, false);

    // Boot 2 starts from it: the interrupted file runs again, the finished ones do not.
    const resumed = resumeFrom(readState(path));
    assert.equal(resumed.failedBeforeWedge, []);
    const rest = KVM_FILES.filter((f) => !(f in resumed.files));
    assert.is(rest.length, KVM_FILES.length - 2);
    assert.ok(rest.includes('net-linux-bulk'));

    // Its totals with the earlier files: the failed test of boot 1 still fails the suite.
    const second = parseUvu(uvuOutput(Object.fromEntries(rest.map((f) => [f, [LINUX_FILES[f] ?? 3, LINUX_FILES[f] ?? 3]])), 0))!;
    const merged = withEarlierFiles(second, resumed);
    assert.is(merged.total, second.total + 2);
    assert.equal(checkTotals(merged), ['1 of ' + merged.total + ' test(s) failed', 'vmm-linux.test.ts: 0 of 1 passed, expected at least 1']);
    // Had boot 1 passed there, the merged run is accepted; without boot 1's files it is not.
    assert.equal(checkTotals(withEarlierFiles(second, { ...resumed, files: { ...resumed.files, 'vmm-linux': { passed: 1, total: 1 } } })), []);
    assert.ok(checkTotals(second).includes('vmm-linux.test.ts did not report'));

    // No state yet: nothing finished, nothing failed; a state file that is not one is an error.
    assert.equal(resumeFrom(readState(join(dir, 'missing.json'))), emptyState());
    writeFileSync(path, '{"not": "a state"}');
    assert.throws(() => readState(path), /not a nested-suite state/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a test that failed before a wedge fails the suite, though the file passes when it runs again', () => {
  const state = emptyState();
  const clock = new FileClock();
  // uvu marks each test as it ends; the file's counts come only when it ends, which the wedge prevents.
  const out = `${ESC}[1mnet-linux-bulk.test.ts${ESC}[22m\n${ESC}[90m• ${ESC}[39m${ESC}[31m✘ ${ESC}[39m`;
  clock.feed(out, 0);
  assert.ok(noteProgress(state, clock, 0));
  assert.equal([state.running, state.runningFailed], ['net-linux-bulk', true]);
  const resumed = resumeFrom(state);
  assert.equal(resumed.failedBeforeWedge, ['net-linux-bulk']);
  assert.ok(!('net-linux-bulk' in resumed.files), 'it runs again');
  // A second wedge elsewhere keeps the first failure.
  assert.equal(resumeFrom({ ...resumed, running: 'probe', runningFailed: false }).failedBeforeWedge, ['net-linux-bulk']);
});

test('skips are counted across boots once each, whatever label the file registered them under; a torn line counts', () => {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-suite-skips-'));
  try {
    const log = join(dir, 'skips');
    assert.is(distinctSkips(log), 0, 'no log: nothing skipped');
    const rec = (file: string, t: string): string => JSON.stringify({ file, test: t, category: 'linux-guest', reason: 'r' }) + '\n';
    // Two boots registered the same file's skip; vmm-kernel-load's label is not its file name.
    writeFileSync(log, rec('vmm-linux', 'boots') + rec('vmm-kernel-load (vmlinux)', 'a') + rec('vmm-linux', 'boots'));
    assert.is(distinctSkips(log), 2);
    writeFileSync(log, rec('vmm-linux', 'boots') + '{"file": "net-li');
    assert.is(distinctSkips(log), 2);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a run of some files (NESTED_SUITE_FILES) is checked against those files only', () => {
  const t = parseUvu(uvuOutput({ probe: [2, 2], 'vmm-linux': [1, 1] }, 0))!;
  assert.equal(checkTotals(t, ['probe', 'vmm-linux']), []);
  assert.ok(checkTotals(t).includes('vmm-boot.test.ts did not report'));
});

test("CI's two L1s (NESTED_SUITE_PART) run every KVM file once between them; a part and a file list together are refused", () => {
  const main = selectedFiles({ NESTED_SUITE_PART: 'main' });
  const side = selectedFiles({ NESTED_SUITE_PART: 'side' });
  assert.equal([...main, ...side].sort(), [...KVM_FILES].sort());
  assert.ok(side.length > 0 && side.every((f) => !main.includes(f)), side.join(', '));
  assert.equal(selectedFiles({}), KVM_FILES);
  assert.equal(selectedFiles({ NESTED_SUITE_FILES: 'probe, vmm-linux' }), ['probe', 'vmm-linux']);
  assert.throws(() => selectedFiles({ NESTED_SUITE_PART: 'half' }), /NESTED_SUITE_PART=half: one of main, side/);
  assert.throws(() => selectedFiles({ NESTED_SUITE_PART: 'side', NESTED_SUITE_FILES: 'probe' }), /one or the other/);
  assert.throws(() => selectedFiles({ NESTED_SUITE_FILES: 'probe,nope' }), /not KVM test files: nope/);
});

// What marks a test file that needs KVM: the skip reasons and registrars that say "no KVM here"
// (test/vmm-guests.ts, test/sandbox-home.ts, lib/sandbox/sandbox.ts) and the two categories of
// test/skip-unless.ts for KVM. Such a file skips on a host without hardware virtualization, so it
// must be in KVM_FILES, or no run of CI would ever run it on a KVM that can.
const NEEDS_KVM = /\b(kvmSkipReason|testvmSkipReason|testvmSandboxTest|linuxGuestSupport)\b|'(kvm|linux-guest)'\)/;

test('every test file that can skip for lack of KVM is in the nested suite (KVM_FILES), and every listed file exists', () => {
  const dir = fileURLToPath(new URL('.', import.meta.url));
  const files = readdirSync(dir).filter((f) => f.endsWith('.test.ts'));
  // This file names the markers without being one.
  const needKvm = files.filter((f) => f !== 'nested-suite.test.ts' && NEEDS_KVM.test(readFileSync(join(dir, f), 'utf8'))).map((f) => f.replace(/\.test\.ts$/, ''));
  const missing = needKvm.filter((f) => !KVM_FILES.includes(f));
  assert.equal(missing, [], `test files that skip without KVM but are not in test/nested/suite.ts KVM_FILES: ${missing.join(', ')}`);
  const absent = KVM_FILES.filter((f) => !files.includes(`${f}.test.ts`));
  assert.equal(absent, [], `KVM_FILES names files that do not exist: ${absent.join(', ')}`);
  // The check itself finds them: the two files this list once forgot are found by it.
  assert.ok(needKvm.includes('vmm-seccomp') && needKvm.includes('vmm-exhaustion'), needKvm.join(', '));
  for (const f of Object.keys(LINUX_FILES)) assert.ok(KVM_FILES.includes(f), `${f} is a Linux file outside KVM_FILES`);
});

test.run();
