// The base root filesystem: a clean ext4 holding python3, bash and the agent
// (as the kernel's init), read without mounting through debugfs.
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { ensureArtifacts, type SetupReport } from '../lib/setup/artifacts.js';
import { imagePackages } from '../lib/setup/rootfs.js';
import { imageDir } from '../lib/setup/paths.js';
import { formatEvent } from '../lib/setup/progress.js';
import { sha256File } from '../lib/store/hash.js';

/** The stored artifacts, building what is missing; undefined (with the reason printed) where this host cannot. */
async function artifacts(): Promise<SetupReport | undefined> {
  try {
    return await ensureArtifacts({ onProgress: (e) => e.status !== 'step' && console.log(`  ${formatEvent(e)}`) });
  } catch (err) {
    if (err instanceof TorporError && (err.code === 'PERMISSION_DENIED' || err.code === 'MISSING_TOOLS')) {
      console.log(`  skipped: cannot build the root filesystem on this host: ${err.message}`);
      return undefined;
    }
    throw err;
  }
}

function debugfs(image: string, request: string): string {
  const r = spawnSync('debugfs', ['-R', request, image], { encoding: 'utf8' });
  return r.stdout + r.stderr;
}

test('the package list is parsed from build.sh (so key and script agree)', async () => {
  const packages = imagePackages(await readFile(join(imageDir, 'build.sh'), 'utf8'));
  for (const p of ['bash', 'coreutils', 'python3', 'sqlite3', 'iproute2', 'procps', 'util-linux', 'ca-certificates']) {
    assert.ok(packages.includes(p), p);
  }
});

test('the rootfs is a clean ext4 holding python3, bash and the agent as init', async () => {
  const report = await artifacts();
  if (!report) return;
  const image = report.rootfs;

  const fsck = spawnSync('e2fsck', ['-fn', image], { encoding: 'utf8' });
  assert.is(fsck.status, 0, `e2fsck -fn: ${fsck.stdout}${fsck.stderr}`);
  const superblock = execFileSync('dumpe2fs', ['-h', image], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] });
  assert.match(superblock, /Block size:\s+4096/);
  assert.match(superblock, /Filesystem volume name:\s+torpor-root/);

  for (const path of ['/usr/bin/python3', '/bin/bash', '/usr/bin/sqlite3', '/usr/sbin/ip', '/usr/sbin/torpor-agent']) {
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
  assert.match(debugfs(image, 'cat /etc/hosts'), /127\.0\.0\.1\s+localhost/);
  // No documentation or man pages (path-exclude), but copyrights stay.
  assert.not.match(debugfs(image, 'ls /usr/share/man'), /man1/);
  const packages = await readFile(join(report.rootfs, '..', 'packages.txt'), 'utf8');
  assert.match(packages, /^python3 /m);
  assert.match(packages, /^bash /m);
});

test.run();
