// The Debian packages: the user's list (deps/debian-packages.txt, quoted in the README) and the
// developer's (deps/debian-packages-dev.txt). .ci/run installs both, setup's checks name only
// packages from them (the image pipeline's from the user's), and `torpor setup --install-deps`
// installs exactly the missing ones setup will use (its --dry-run prints the commands).
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { setupOutlook } from '../lib/setup/artifacts.js';
import { DEVELOPER_PACKAGES_FILE, debianPackages, installCommands, missingDebianPackages } from '../lib/setup/deps.js';
import { packageRoot } from '../lib/setup/paths.js';
import { missingPackages, toolPackages } from '../lib/setup/tools.js';
import { needsCommands, testUnless } from './skip-unless.js';

const withDpkg = testUnless('deps', needsCommands('dpkg-query'), 'tools');

const userList = debianPackages();
const devList = debianPackages(DEVELOPER_PACKAGES_FILE);

test('the lists: one package per line, no duplicates, every package a setup check names is on one; no compiler on the user\'s', () => {
  const both = [...userList, ...devList];
  assert.ok(devList.length >= 20, `${devList.length} developer packages`);
  assert.is(new Set(both).size, both.length, 'no duplicates, within or across the lists');
  for (const pkg of both) assert.match(pkg, /^[a-z0-9][a-z0-9.+-]+$/, pkg);
  for (const pkg of toolPackages()) assert.ok(both.includes(pkg), `${pkg} (lib/setup/tools.ts) is on a list`);
  for (const pkg of toolPackages(['image'])) assert.ok(userList.includes(pkg), `${pkg} (the image pipeline) is on the user's list`);
  for (const pkg of ['build-essential', 'gcc', 'make', 'linux-source-6.1', 'mmdebstrap', 'musl-tools']) {
    assert.not.ok(userList.includes(pkg), `${pkg} is not on the user's list`);
  }
});

test('.ci/run installs exactly the two lists: its reader, run by bash, yields the same packages', () => {
  const ci = readFileSync(join(packageRoot, '.ci', 'run'), 'utf8');
  const reader = /^packages=\$\((.*)\)$/m.exec(ci);
  assert.ok(reader, '.ci/run reads the list into $packages');
  assert.match(reader![1]!, /deps\/debian-packages\.txt deps\/debian-packages-dev\.txt/);
  assert.match(ci, /^apt-get install -y --no-install-recommends \$packages$/m);
  const r = spawnSync('bash', ['-c', reader![1]!], { cwd: packageRoot, encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  assert.equal(r.stdout.trim().split('\n'), [...userList, ...devList]);
});

test("the README quotes the user's list", () => {
  const readme = readFileSync(join(packageRoot, 'README.md'), 'utf8');
  assert.match(readme, /deps\/debian-packages\.txt/);
  const quoted = /```text\n\s*# deps\/debian-packages\.txt\n([^`]*)```/.exec(readme);
  assert.ok(quoted, 'a ```text block starting with "# deps/debian-packages.txt"');
  assert.equal(quoted![1]!.trim().split(/\s+/), userList);
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

withDpkg('torpor setup --install-deps --dry-run prints the commands for what this host misses, and runs nothing', async () => {
  const bin = join(packageRoot, 'bin', 'torpor.js');
  const r = spawnSync(process.execPath, [bin, 'setup', '--install-deps', '--dry-run'], { encoding: 'utf8' });
  assert.is(r.status, 0, r.stderr);
  const root = process.getuid?.() === 0;
  const missing = [...new Set([...missingDebianPackages(), ...missingPackages((await setupOutlook()).tools)])];
  const expected = installCommands(missing, root).map((argv) => argv.join(' ') + '\n').join('');
  assert.is(r.stdout, expected || 'setup: no Debian packages missing\n');
  const alone = spawnSync(process.execPath, [bin, 'setup', '--dry-run'], { encoding: 'utf8' });
  assert.is(alone.status, 2);
  assert.match(alone.stderr, /--dry-run goes with --install-deps/);
});

test.run();
