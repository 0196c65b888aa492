// The README's commands are what .ci/run runs: read from the README (test/readme-commands.ts).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { packageRoot } from '../lib/setup/paths.js';
import { readmeCommands } from './readme-commands.js';

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

test('the README stays a user\'s document: under 15 KB, no dated run logs', () => {
  const readme = readFileSync(join(packageRoot, 'README.md'), 'utf8');
  assert.ok(Buffer.byteLength(readme) < 15 * 1024, `${Buffer.byteLength(readme)} bytes`);
  assert.not.match(readme, /\(20\d\d-\d\d-\d\d \d\d:\d\d/, 'a timestamped run note');
  assert.not.match(readme, /DESIGN §/);
});

test.run();
