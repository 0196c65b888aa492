// The base root filesystem: a clean ext4 holding python3, bash and the agent
// (as the kernel's init), read without mounting through debugfs.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, copyFile, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { ensureArtifacts, type SetupReport } from '../lib/setup/artifacts.js';
import { baseInputs, imagePackages } from '../lib/setup/rootfs.js';
import { artifactDir, artifactKey } from '../lib/store/artifact.js';
import { homeLayout } from '../lib/store/home.js';
import { imageDir } from '../lib/setup/paths.js';
import { formatEvent } from '../lib/setup/progress.js';
import { sha256File } from '../lib/store/hash.js';
import { needsRootAnd, needsSetup, testUnless } from './skip-unless.js';

/** The stored artifacts, building what is missing (only where needsSetup() found nothing in the way). */
function artifacts(): Promise<SetupReport> {
  return ensureArtifacts({ onProgress: (e) => e.status !== 'step' && console.log(`  ${formatEvent(e)}`) });
}

function debugfs(image: string, request: string): string {
  const r = spawnSync('debugfs', ['-R', request, image], { encoding: 'utf8' });
  return r.stdout + r.stderr;
}

test('the package list is parsed from build.sh (so key and script agree)', async () => {
  const packages = imagePackages(await readFile(join(imageDir, 'build.sh'), 'utf8'));
  for (const p of ['bash', 'coreutils', 'python3', 'sqlite3', 'iproute2', 'procps', 'util-linux', 'ca-certificates', 'sudo', 'curl', 'git']) {
    assert.ok(packages.includes(p), p);
  }
});

testUnless('image', await needsSetup(), 'artifacts')('the rootfs is a clean ext4 holding python3, bash and the agent as init', async () => {
  const report = await artifacts();
  const image = report.rootfs;

  const fsck = spawnSync('e2fsck', ['-fn', image], { encoding: 'utf8' });
  assert.is(fsck.status, 0, `e2fsck -fn: ${fsck.stdout}${fsck.stderr}`);
  const superblock = execFileSync('dumpe2fs', ['-h', image], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  assert.match(superblock, /Block size:\s+4096/);
  assert.match(superblock, /Filesystem volume name:\s+torpor-root/);

  for (const path of ['/usr/bin/python3', '/bin/bash', '/usr/bin/sqlite3', '/usr/sbin/ip', '/usr/bin/curl', '/usr/bin/git', '/usr/sbin/torpor-agent']) {
    const out = debugfs(image, `stat ${path}`);
    assert.match(out, /Inode: \d+\s+Type: (regular|symlink)/, `${path} in the image: ${out}`);
  }
  const agentStat = debugfs(image, 'stat /usr/sbin/torpor-agent');
  assert.match(agentStat, /Mode:\s+0755/);
  assert.match(agentStat, /User:\s+0\s+Group:\s+0/);

  // The agent in the image is byte for byte the stored agent artifact.
  const dir = await mkdtemp(join(tmpdir(), 'torpor-image-test-'));
  try {
    const copy = join(dir, 'torpor-agent');
    debugfs(image, `dump /usr/sbin/torpor-agent ${copy}`);
    assert.is(await sha256File(copy), await sha256File(report.agent));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }

  assert.is(debugfs(image, 'cat /etc/hostname').split('\n').find((l) => l === 'torpor'), 'torpor');
  assert.match(debugfs(image, 'cat /etc/passwd'), /^nobody:x:65534:/m);
  // E2B's default user: `user`, uid 1000, /home/user, root through sudo without a password.
  assert.match(debugfs(image, 'cat /etc/passwd'), /^user:x:1000:1000:[^:]*:\/home\/user:\/bin\/bash$/m);
  assert.match(debugfs(image, 'stat /home/user'), /User:\s+1000\s+Group:\s+1000/);
  assert.match(debugfs(image, 'cat /etc/sudoers.d/user'), /^user ALL=\(ALL:ALL\) NOPASSWD: ALL$/m);
  assert.match(debugfs(image, 'cat /etc/hosts'), /127\.0\.0\.1\s+localhost/);
  // No documentation or man pages (path-exclude), but copyrights stay.
  assert.not.match(debugfs(image, 'ls /usr/share/man'), /man1/);
  const packages = await readFile(join(report.rootfs, '..', 'packages.txt'), 'utf8');
  assert.match(packages, /^python3 /m);
  assert.match(packages, /^bash /m);
});

testUnless('image', needsRootAnd('mount'), 'root')('a failed mmdebstrap leaves no mounts and no tree, and the delete never crosses into a bind-mounted host directory', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'torpor-image-fail-'));
  try {
    // The host's precious directory, on the same file system as the build (so --one-file-system cannot see the bind).
    const host = join(dir, 'host data');
    await mkdir(host);
    await writeFile(join(host, 'keep'), 'host file');
    // A stand-in mmdebstrap that dies the way a killed real one would: mounts still in the chroot.
    const bin = join(dir, 'bin');
    await mkdir(bin);
    await writeFile(
      join(bin, 'mmdebstrap'),
      `#!/bin/bash
set -e
while [[ $1 != bookworm ]]; do shift; done
tree=$2
mkdir -p "$tree/proc" "$tree/mnt/host data" "$tree/etc"
mount -t tmpfs none "$tree/proc"
mount --bind ${JSON.stringify(host)} "$tree/mnt/host data"
echo "E: pretend failure" >&2
exit 1
`,
    );
    await chmod(join(bin, 'mmdebstrap'), 0o755);
    const out = join(dir, 'out');
    const r = spawnSync(join(imageDir, 'build.sh'), [out], {
      encoding: 'utf8',
      env: { ...process.env, PATH: `${bin}:${process.env.PATH}`, APT_SOURCES: '/dev/null' },
    });
    assert.is.not(r.status, 0, 'the build failed');
    assert.match(r.stderr, /pretend failure/);
    assert.is(await readFile(join(host, 'keep'), 'utf8'), 'host file', 'the host directory was not touched');
    const mounts = await readFile('/proc/self/mountinfo', 'utf8');
    assert.not.ok(mounts.includes(out), 'no mounts left under the build directory');
    assert.not.ok(existsSync(join(out, 'tree')), 'the tree is gone');
  } finally {
    // Whatever a failure left mounted (mountinfo escapes the space as \040), deepest first.
    const left = (await readFile('/proc/self/mountinfo', 'utf8'))
      .split('\n')
      .map((l) => (l.split(' ')[4] ?? '').replace(/\\([0-7]{3})/g, (_m, o: string) => String.fromCharCode(parseInt(o, 8))))
      .filter((p) => p.startsWith(dir + '/'))
      .sort()
      .reverse();
    for (const p of left) spawnSync('umount', ['-l', p]);
    await rm(dir, { recursive: true, force: true });
  }
});

testUnless('image', needsRootAnd('setpriv'), 'root')('add-agent.sh needs no root: a user writes the agent into a copy of a read-only base image', async () => {
  const report = await artifacts();
  if (!report) return;
  const dir = await mkdtemp(join(tmpdir(), 'torpor-add-agent-'));
  try {
    const base = join(dir, 'base.ext4');
    const baseDir = artifactDir(homeLayout().artifacts, 'rootfs-base', artifactKey('rootfs-base', await baseInputs()));
    execFileSync('cp', ['--sparse=always', join(baseDir, 'base.ext4'), base]);
    await copyFile(report.agent, join(dir, 'agent'));
    await chmod(base, 0o444); // as the store keeps it
    await chmod(dir, 0o777);
    execFileSync('chown', ['-R', '65534:65534', dir]);
    const r = spawnSync(
      'setpriv',
      ['--reuid', '65534', '--regid', '65534', '--clear-groups', join(imageDir, 'add-agent.sh'), base, join(dir, 'agent'), join(dir, 'out.ext4')],
      { encoding: 'utf8' },
    );
    assert.is(r.status, 0, r.stdout + r.stderr);
    assert.match(debugfs(join(dir, 'out.ext4'), 'stat /usr/sbin/torpor-agent'), /Mode:\s+0755/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test.run();
