// The Debian packages torpor needs: the user's list (deps/debian-packages.txt, quoted in the
// README) and the developer's (deps/debian-packages-dev.txt: builds from source, tests), both
// installed by .ci/run; which of them are missing here, and the apt-get commands that install
// exactly those (`torpor setup --install-deps`).
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';

import { TorporError } from '../errors.js';
import { packageRoot } from './paths.js';

export const DEBIAN_PACKAGES_FILE = join(packageRoot, 'deps', 'debian-packages.txt');
export const DEVELOPER_PACKAGES_FILE = join(packageRoot, 'deps', 'debian-packages-dev.txt');

/** The list's packages, in file order ('#' comments and blank lines dropped). */
export function debianPackages(file: string = DEBIAN_PACKAGES_FILE): string[] {
  return readFileSync(file, 'utf8')
    .split('\n')
    .map((line) => line.replace(/#.*/, '').trim())
    .filter((line) => line !== '');
}

/** Those of `packages` that dpkg does not list as installed, in the given order. */
export function missingDebianPackages(packages: string[] = debianPackages()): string[] {
  if (packages.length === 0) return [];
  // Unknown packages make dpkg-query exit 1 and complain on stderr: they are missing, not an error.
  const r = spawnSync('dpkg-query', ['-W', '-f=${Package} ${db:Status-Abbrev}\n', ...packages], { encoding: 'utf8' });
  if (r.error) {
    throw new TorporError(
      'MISSING_TOOLS',
      `dpkg-query is not available (${r.error.message}): --install-deps works on Debian and Ubuntu. ` +
        `Install these with your package manager: ${packages.join(' ')}`,
    );
  }
  const installed = new Set<string>();
  for (const line of r.stdout.split('\n')) {
    const [name, status] = line.split(' ');
    // "ii": wanted install, installed. Multi-arch names come back as name:arch.
    if (name && status === 'ii') installed.add(name.replace(/:.*/, ''));
  }
  return packages.filter((p) => !installed.has(p));
}

/** The commands that install `missing` (apt-get update first), through sudo when not root. Empty when nothing is missing. */
export function installCommands(missing: string[], asRoot: boolean): string[][] {
  if (missing.length === 0) return [];
  const sudo = asRoot ? [] : ['sudo'];
  return [
    [...sudo, 'apt-get', 'update'],
    [...sudo, 'env', 'DEBIAN_FRONTEND=noninteractive', 'apt-get', 'install', '-y', '--no-install-recommends', ...missing],
  ];
}

/** Runs the commands in order with their output on this terminal; throws on the first that fails. */
export function runInstall(commands: string[][]): void {
  for (const argv of commands) {
    const r = spawnSync(argv[0]!, argv.slice(1), { stdio: 'inherit' });
    if (r.error || r.status !== 0) {
      const why = r.error ? r.error.message : `exit status ${r.status ?? r.signal}`;
      const hint = argv[0] === 'sudo' && r.error ? ' (sudo is not installed: run torpor setup --install-deps as root)' : '';
      throw new TorporError('MISSING_TOOLS', `installing the Debian packages failed: \`${argv.join(' ')}\`: ${why}${hint}`);
    }
  }
}
