// The nested suite's count check (test/nested/suite.ts) against uvu's real
// output format: a skipped or missing Linux-guest test must fail the suite.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

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

test.run();
