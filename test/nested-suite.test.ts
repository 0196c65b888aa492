// The nested suite's count check (test/nested/suite.ts) against uvu's real
// output format: a skipped or missing Linux-guest test must fail the suite.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { FileClock } from './nested/file-clock.js';
import { KVM_FILES, LINUX_FILES, checkTotals, parseUvu } from './nested/suite.js';

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
  assert.equal(t.files.get('sandbox-linux'), { passed: 2, total: 2 });
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
  assert.equal(clock.done, [{ name: 'agent-testvm', seconds: 0 }]);
  const secondEnds = out.indexOf('(1 / 1)', cut);
  clock.feed(out.slice(cut, secondEnds), 2_000);
  assert.is(clock.current, 'net-linux-bulk');
  assert.is(clock.runningFor(902_000), 900);
  clock.feed(out.slice(secondEnds), 62_000);
  assert.is(clock.current, undefined);
  assert.is(clock.runningFor(99_000), 0);
  assert.is(clock.slowest(1), 'net-linux-bulk 60 s');
});

test.run();
