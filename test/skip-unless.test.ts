// The skip registrar through a real uvu run: a skipped test is counted by uvu as
// skipped, never run, listed with its reason at the end of the output and in
// $TORPOR_SKIP_LOG; skip-report fails on a forbidden category.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { formatSkips, readSkipLog } from './skip-unless.js';

const ROOT = join(import.meta.dirname, '..');

function node(args: string[], env: NodeJS.ProcessEnv) {
  return spawnSync(process.execPath, ['--import', 'tsx', ...args], { cwd: ROOT, encoding: 'utf8', env: { ...process.env, FORCE_COLOR: '0', ...env } });
}

test('skipped tests are counted by uvu, listed last with their reasons, and logged by category', () => {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-skips-'));
  try {
    const log = join(dir, 'skips.jsonl');
    const r = node(['node_modules/uvu/bin.js', '-c', 'false', 'test/fixtures/skips', 'two-skips\\.ts$'], { TORPOR_SKIP_LOG: log });
    assert.is(r.status, 0, r.stdout + r.stderr);
    assert.match(r.stdout, /Total:\s+1\s+Passed:\s+1\s+Skipped:\s+2/);
    assert.ok(
      r.stdout.trimEnd().endsWith(
        'skipped tests: 2\n' +
          '  [linux-guest] fixture: boots Linux -- no Linux guest here\n' +
          '  [root] fixture: as root -- needs root',
      ),
      r.stdout,
    );
    assert.equal(readSkipLog(log), [
      { file: 'fixture', test: 'boots Linux', category: 'linux-guest', reason: 'no Linux guest here' },
      { file: 'fixture', test: 'as root', category: 'root', reason: 'needs root' },
    ]);
    const report = node(['test/skip-report.ts', log], {});
    assert.is(report.status, 0);
    assert.match(report.stdout, /^skipped tests: 2\n/);
    const strict = node(['test/skip-report.ts', '--fail-on', 'linux-guest', log], {});
    assert.is(strict.status, 1);
    assert.match(strict.stderr, /1 test\(s\) of category linux-guest skipped where they must run/);
    // The nested host ran them: listed apart, not as skipped, and no longer a failure.
    const moved = node(['test/skip-report.ts', '--fail-on', 'linux-guest', '--ran-elsewhere', 'linux-guest=in the nested host', log], {});
    assert.is(moved.status, 0, moved.stderr);
    assert.is(
      moved.stdout,
      'not run on this host, run instead in the nested host: 1 [linux-guest] test(s) of fixture\n' +
        'skipped tests: 1\n  [root] fixture: as root -- needs root\n',
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('tests skipped for one reason are listed under it, the reason said once', () => {
  const linux = { category: 'linux-guest' as const, reason: 'this host cannot boot a Linux guest' };
  assert.is(
    formatSkips([
      { file: 'net-linux', test: 'egress', ...linux },
      { file: 'fixture', test: 'as root', category: 'root', reason: 'needs root' },
      { file: 'sandbox-linux', test: 'fork(2)', ...linux },
    ]),
    'skipped tests: 3\n' +
      '  [linux-guest] 2 tests -- this host cannot boot a Linux guest\n' +
      '    net-linux: egress\n' +
      '    sandbox-linux: fork(2)\n' +
      '  [root] fixture: as root -- needs root\n',
  );
});

test.run();
