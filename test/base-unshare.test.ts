// The Debian base without root: an ordinary user (nobody, uid 65534, given a subordinate id range
// as adduser gives every new user) with no base image to pull and no root-built base stored runs
// `torpor setup`; guest/image/build.sh --tar builds the tree in mmdebstrap's unshare mode and the
// image pipeline writes the ext4 as that user. The image must hold what the root build holds:
// files owned by root, sudo setuid, /home/user owned by uid 1000. The kernel and agent are the
// store's (TORPOR_KERNEL, TORPOR_AGENT), so only the base is built. Needs the host's apt sources
// (a Debian mirror): a host test, not one for the nested host.
import { spawnSync } from 'node:child_process';
import { chmod, copyFile, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { packageRoot } from '../lib/setup/paths.js';
import { needsRootAnd, testUnless } from './skip-unless.js';
import { needsPrograms } from './image-registry.js';
import { ensureArtifacts } from '../lib/setup/artifacts.js';

const FILE = 'base-unshare';
const NOBODY = 65534;
const cannot = needsRootAnd('setpriv', 'mmdebstrap') ?? needsPrograms('newuidmap', 'debugfs');
const hostTest = testUnless(FILE, cannot, cannot?.startsWith('needs root') ? 'root' : 'tools');

/** Adds `nobody` to /etc/subuid and /etc/subgid for the test; returns what puts them back. */
async function subordinateIds(): Promise<() => Promise<void>> {
  const saved: Array<[string, string | null]> = [];
  for (const file of ['/etc/subuid', '/etc/subgid']) {
    const text = await readFile(file, 'utf8').catch(() => null);
    saved.push([file, text]);
    if (!(text ?? '').split('\n').some((l) => l.startsWith('nobody:'))) {
      await writeFile(file, `${text ?? ''}${text && !text.endsWith('\n') ? '\n' : ''}nobody:300000:65536\n`);
    }
  }
  return async () => {
    for (const [file, text] of saved) {
      if (text === null) await rm(file, { force: true });
      else await writeFile(file, text);
    }
  };
}

/** `debugfs -R "stat PATH"`'s mode and owner of one file in an ext4 image. */
function ext4Stat(image: string, path: string): { mode: number; uid: number } {
  const r = spawnSync('debugfs', ['-R', `stat ${path}`, image], { encoding: 'utf8' });
  const mode = /Mode:\s+0?([0-7]+)/.exec(r.stdout);
  const uid = /User:\s+(\d+)/.exec(r.stdout);
  assert.ok(mode && uid, `debugfs stat ${path}: ${r.stdout}${r.stderr}`);
  return { mode: parseInt(mode![1]!, 8), uid: Number(uid![1]) };
}

hostTest('an ordinary user builds the Debian base in unshare mode: setup says so, and the image holds what the root build holds', async () => {
  const { kernel, agent } = await ensureArtifacts();
  const dir = await mkdtemp(join(tmpdir(), 'torpor-base-unshare-'));
  await chmod(dir, 0o777);
  const restore = await subordinateIds();
  try {
    // The store's kernel and agent, where the user can read them (root's home is not).
    await copyFile(kernel, join(dir, 'vmlinux'));
    await copyFile(agent, join(dir, 'torpor-agent'));
    const env: Record<string, string> = {
      PATH: process.env.PATH ?? '/usr/bin:/bin',
      HOME: dir,
      TORPOR_HOME: join(dir, 'home'),
      TORPOR_KERNEL: join(dir, 'vmlinux'),
      TORPOR_AGENT: join(dir, 'torpor-agent'),
    };
    const asNobody = (args: string[]) =>
      spawnSync('setpriv', ['--reuid', String(NOBODY), '--regid', String(NOBODY), '--clear-groups', process.execPath, join(packageRoot, 'bin', 'torpor.js'), ...args], {
        cwd: dir,
        env,
        encoding: 'utf8',
        timeout: 900_000,
        maxBuffer: 64 << 20,
      });
    const doctor = asNobody(['doctor']);
    assert.match(doctor.stdout, /^base root filesystem: Debian bookworm .*mmdebstrap's unshare mode: no root/m, doctor.stdout + doctor.stderr);
    assert.match(doctor.stdout, /^first run will: .*build the rootfs from source/m);

    const t0 = Date.now();
    const r = asNobody(['setup', '--json']);
    assert.is(r.status, 0, r.stderr.slice(-4000));
    const report = JSON.parse(r.stdout) as { rootfs: string; built: string[]; sources: { base: string } };
    assert.equal(report.built, ['rootfs']);
    assert.match(report.sources.base, /unshare mode/);
    assert.match(r.stderr, /rootfs: starting Debian bookworm \+ \d+ packages \(mmdebstrap's unshare mode, no root\)/);
    assert.match(report.rootfs, /\/artifacts\/rootfs-user\//);

    const sudo = ext4Stat(report.rootfs, '/usr/bin/sudo');
    assert.is(sudo.uid, 0, 'sudo is root\'s');
    assert.is(sudo.mode & 0o7777, 0o4755, 'sudo keeps its setuid bit');
    assert.is(ext4Stat(report.rootfs, '/home/user').uid, 1000);
    assert.is(ext4Stat(report.rootfs, '/etc/shadow').uid, 0);
    assert.is(ext4Stat(report.rootfs, '/usr/sbin/torpor-agent').uid, 0, 'the agent is in the image');
    const owner = spawnSync('stat', ['-c', '%u', report.rootfs], { encoding: 'utf8' }).stdout.trim();
    assert.is(owner, String(NOBODY), 'the image file is the user\'s');
    console.log(`  base-unshare: Debian base built as uid ${NOBODY} in ${((Date.now() - t0) / 1000).toFixed(1)} s (mmdebstrap unshare mode, then mke2fs -d)`);

    const again = asNobody(['setup', '--json']);
    assert.is(again.status, 0, again.stderr);
    assert.equal((JSON.parse(again.stdout) as { built: string[] }).built, [], 'a second setup builds nothing');
  } finally {
    await restore();
    await rm(dir, { recursive: true, force: true });
  }
});

test.run();
