// The one list of Debian packages (deps/debian-packages.txt): .ci/run installs it, setup's
// checks name only packages from it, and `torpor setup --install-deps` installs exactly the
// missing ones (its --dry-run prints the commands it would run).
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { debianPackages, installCommands, missingDebianPackages } from '../lib/setup/deps.js';
import { packageRoot } from '../lib/setup/paths.js';
import { toolPackages } from '../lib/setup/tools.js';
import { needsCommands, testUnless } from './skip-unless.js';

const withDpkg = testUnless('deps', needsCommands('dpkg-query'), 'tools');

test('the list: one package per line, no duplicates, every package a setup check names is on it', () => {
  const list = debianPackages();
  assert.ok(list.length >= 20, `${list.length} packages`);
  assert.is(new Set(list).size, list.length, 'no duplicates');
  for (const pkg of list) assert.match(pkg, /^[a-z0-9][a-z0-9.+-]+$/, pkg);
  for (const pkg of toolPackages()) assert.ok(list.includes(pkg), `${pkg} (lib/setup/tools.ts) is in deps/debian-packages.txt`);
});

test('.ci/run installs exactly the list: its reader, run by bash, yields the same packages', () => {
  const ci = readFileSync(join(packageRoot, '.ci', 'run'), 'utf8');
  const reader = /^packages=\$\((.*)\)$/m.exec(ci);
  assert.ok(reader, '.ci/run reads the list into $packages');
  assert.match(reader![1]!, /deps\/debian-packages\.txt/);
  assert.match(ci, /^apt-get install -y --no-install-recommends \$packages$/m);
  const r = spawnSync('bash', ['-c', reader![1]!], { cwd: packageRoot, encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  assert.equal(r.stdout.trim().split('\n'), debianPackages());
});

test('the README quotes the list', () => {
  const readme = readFileSync(join(packageRoot, 'README.md'), 'utf8');
  assert.match(readme, /deps\/debian-packages\.txt/);
  const quoted = /```text\n\s*# deps\/debian-packages\.txt\n([^`]*)```/.exec(readme);
  assert.ok(quoted, 'a ```text block starting with "# deps/debian-packages.txt"');
  assert.equal(quoted![1]!.trim().split(/\s+/), debianPackages());
});

test('install commands: apt-get update, then apt-get install of exactly the missing set; sudo when not root', () => {
  assert.equal(installCommands([], true), []);
  assert.equal(installCommands(['flex', 'bc'], true), [
    ['apt-get', 'update'],
    ['env', 'DEBIAN_FRONTEND=noninteractive', 'apt-get', 'install', '-y', '--no-install-recommends', 'flex', 'bc'],
  ]);
  assert.equal(installCommands(['qemu-system-x86'], false), [
    ['sudo', 'apt-get', 'update'],
    ['sudo', 'env', 'DEBIAN_FRONTEND=noninteractive', 'apt-get', 'install', '-y', '--no-install-recommends', 'qemu-system-x86'],
  ]);
});

withDpkg('missing packages come from dpkg: an installed one is not missing, an unknown one is', () => {
  assert.equal(missingDebianPackages(['bash', 'torpor-no-such-package', 'coreutils']), ['torpor-no-such-package']);
  assert.equal(missingDebianPackages([]), []);
});

withDpkg('torpor setup --install-deps --dry-run prints the commands for what this host misses, and runs nothing', () => {
  const bin = join(packageRoot, 'bin', 'torpor.js');
  const r = spawnSync(process.execPath, [bin, 'setup', '--install-deps', '--dry-run'], { encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  const root = process.getuid?.() === 0;
  const expected = installCommands(missingDebianPackages(), root).map((argv) => argv.join(' ') + '\n').join('');
  assert.is(r.stdout, expected || 'setup: no Debian packages missing\n');
  const alone = spawnSync(process.execPath, [bin, 'setup', '--dry-run'], { encoding: 'utf8' });
  assert.is(alone.status, 2);
  assert.match(alone.stderr, /--dry-run goes with --install-deps/);
});

test.run();
