// The README's commands are what .ci/run runs: read from the README (test/readme-commands.ts).
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { packageRoot } from '../lib/setup/paths.js';
import { failureCollector, readmeCommands } from './readme-commands.js';

test("the README's commands: install, test, demo (comments dropped)", () => {
  assert.equal(readmeCommands(), ['npm install', 'npm test', 'npm run demo']);
  assert.equal(readmeCommands('## Contributing: from a checkout\n\n```sh\nnpm ci   # deps\n# a comment\n\nnpm test\n```\n\n## Next\n'), ['npm ci', 'npm test']);
  assert.equal(readmeCommands('## Contributing\n\n```sh\nnpm ci\n```\n\nthe last section, no heading after it\n'), ['npm ci']);
  assert.throws(() => readmeCommands('## Other\n'), /no "## Contributing" section/);
});

test('.ci/run runs them from the README of a fresh clone with an empty TORPOR_HOME, not a copy of its own', () => {
  const ci = readFileSync(join(packageRoot, '.ci', 'run'), 'utf8');
  assert.match(ci, /^node --import tsx test\/readme-commands\.ts --run --in "\$fresh\/torpor"$/m);
  assert.match(ci, /^git clone -q "\$PWD" "\$fresh\/torpor"$/m);
  assert.match(ci, /^export TORPOR_HOME="\$fresh\/home"$/m);
  assert.not.match(ci, /^npm test$/m);
});

test("a failed run names its failures again at the end: uvu's real output of a failing test file", () => {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-readme-fail-'));
  try {
    // Imports by path: the file lies outside this checkout's node_modules.
    const uvu = join(packageRoot, 'node_modules', 'uvu');
    for (const name of ['one', 'two']) {
      writeFileSync(join(dir, `${name}.test.mjs`), [
        `import { test } from '${pathToFileURL(join(uvu, 'dist', 'index.mjs'))}';`,
        `import * as assert from '${pathToFileURL(join(uvu, 'assert', 'index.mjs'))}';`,
        "test('passes', () => assert.ok(true));",
        name === 'two' ? "test('the guest said no', () => assert.is('no', 'yes', 'the agent answered no'));" : '',
        'test.run();',
      ].join('\n'));
    }
    const r = spawnSync(process.execPath, [join(uvu, 'bin.js'), dir, '\\.test\\.mjs$'], { encoding: 'utf8', env: { ...process.env, FORCE_COLOR: '1' } });
    assert.is(r.status, 1, r.stdout + r.stderr);
    const collector = failureCollector();
    for (const line of (r.stdout + r.stderr).split('\n')) collector.line(line);
    assert.equal(collector.failures, ['  two.test.mjs: FAIL "the guest said no"\n    the agent answered no  (is)']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the README stays a user\'s document: under 15 KB, no dated run logs', () => {
  const readme = readFileSync(join(packageRoot, 'README.md'), 'utf8');
  assert.ok(Buffer.byteLength(readme) < 15 * 1024, `${Buffer.byteLength(readme)} bytes`);
  assert.not.match(readme, /\(20\d\d-\d\d-\d\d \d\d:\d\d/, 'a timestamped run note');
  assert.not.match(readme, /DESIGN §/);
});

test.run();
