// `torpor ls|info|pause|kill|prune` and the owner rules of the sandbox commands, run as a user
// runs them (node bin/torpor.js, a separate process) on sandboxes this process made, with the
// test guest standing in for Linux (guest/testvm answers HELLO, PING, SYNC and RESUMED but runs
// no programs: exec, shell and logs run in test/cli-linux.test.ts; usage errors and prune's
// cases without a machine in test/cli-plain.test.ts). TORPOR_HOME is a fresh directory whose
// artifacts/ links to the real store.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Sandbox } from '../lib/sandbox/sandbox.js';
import { NESTED } from './bounds.js';
import { runTorpor } from './fixtures/cli.js';
import { privateHome, testvmSandboxTest } from './sandbox-home.js';
import { testvmImage } from './vmm-guests.js';

const kvmTest = await testvmSandboxTest('cli-sandbox');
const kernel = testvmImage()!;
/** A CLI run is a Node start with tsx: seconds in the emulated nested host. */
const CLI_MS = NESTED ? 180_000 : 60_000;

const bootOpts = () => ({
  template: false as const,
  vcpus: 1,
  memoryMiB: 64,
  boot: { kernel, timeoutMs: 15_000, cmdlineExtra: 'testvm.agent_ready=1 testvm.count=1' },
});

const torpor = (...args: string[]) => runTorpor(CLI_MS, ...args);

privateHome(test, 'torpor-cli-');

kvmTest('ls, info and pause of a paused sandbox; a sandbox this process runs is SANDBOX_BUSY, naming this pid; kill', async () => {
  const paused = await Sandbox.create(bootOpts());
  const running = await Sandbox.create(bootOpts());
  try {
    await paused.pause();

    const ls = await torpor('ls', '--json');
    assert.is(ls.status, 0, ls.stderr);
    const listed = JSON.parse(ls.stdout) as Array<{ sandboxId: string; state: string; ownerPid: number | null }>;
    const byId = new Map(listed.map((s) => [s.sandboxId, s]));
    assert.is(byId.get(paused.sandboxId)?.state, 'paused');
    assert.is(byId.get(running.sandboxId)?.state, 'running');
    assert.is(byId.get(running.sandboxId)?.ownerPid, process.pid);

    const human = await torpor('ls', '--state', 'paused');
    assert.is(human.status, 0, human.stderr);
    assert.match(human.stdout, /^ID\s+STATE\s+TEMPLATE/);
    assert.ok(human.stdout.includes(paused.sandboxId), human.stdout);
    assert.not.ok(human.stdout.includes(running.sandboxId), 'filtered by --state');

    const info = await torpor('info', running.sandboxId);
    assert.is(info.status, 0, info.stderr);
    assert.match(info.stdout, new RegExp(`^state:\\s+running \\(owned by pid ${process.pid}\\)$`, 'm'));

    const again = await torpor('pause', paused.sandboxId);
    assert.is(again.status, 0, again.stderr);
    assert.match(again.stdout, /already paused \(generation 1\)/);

    for (const args of [['pause', running.sandboxId], ['kill', running.sandboxId]]) {
      const busy = await torpor(...args);
      assert.is(busy.status, 1, `${args[0]}: ${busy.stderr}`);
      assert.match(busy.stderr, /^torpor: SANDBOX_BUSY: /);
      assert.match(busy.stderr, new RegExp(`process ${process.pid}\\b`));
    }
    // exec passes a program's status through, so its own failure is 125, not 1.
    const exec = await torpor('exec', running.sandboxId, '--', 'true');
    assert.is(exec.status, 125, exec.stderr);
    assert.match(exec.stderr, /SANDBOX_BUSY/);
    assert.ok(running.isRunning(), 'refused commands left the running sandbox alone');

    const killed = await torpor('kill', paused.sandboxId);
    assert.is(killed.status, 0, killed.stderr);
    const gone = await torpor('info', paused.sandboxId);
    assert.is(gone.status, 1);
    assert.match(gone.stderr, /SANDBOX_NOT_FOUND/);
    const missing = await torpor('kill', paused.sandboxId);
    assert.is(missing.status, 1);
    assert.match(missing.stderr, /SANDBOX_NOT_FOUND/);
  } finally {
    await running.kill().catch(() => undefined);
    await Sandbox.kill(paused.sandboxId).catch(() => undefined);
  }
});

kvmTest('prune: --dry-run lists, then removes paused sandboxes older than --older-than; running ones untouched', async () => {
  const old = await Sandbox.create(bootOpts());
  const running = await Sandbox.create(bootOpts());
  try {
    await old.pause();
    const keep = await torpor('prune', '--older-than', '1h', '--json');
    assert.is(keep.status, 0, keep.stderr);
    assert.equal((JSON.parse(keep.stdout) as { sandboxes: unknown[] }).sandboxes, [], 'paused a moment ago: younger than 1h');

    const dry = await torpor('prune', '--older-than', '0', '--dry-run', '--json');
    assert.is(dry.status, 0, dry.stderr);
    const planned = JSON.parse(dry.stdout) as { dryRun: boolean; sandboxes: Array<{ sandboxId: string; bytesOnDisk: number }> };
    assert.ok(planned.dryRun);
    assert.equal(planned.sandboxes.map((s) => s.sandboxId), [old.sandboxId]);
    assert.ok(planned.sandboxes[0]!.bytesOnDisk > 0);
    assert.is((await Sandbox.getInfo(old.sandboxId)).state, 'paused', 'a dry run removes nothing');

    const done = await torpor('prune', '--older-than', '0');
    assert.is(done.status, 0, done.stderr);
    assert.match(done.stdout, /^removed 1 paused sandbox /);
    assert.equal((await Sandbox.list()).map((s) => s.sandboxId), [running.sandboxId]);
    assert.ok(running.isRunning());
  } finally {
    await running.kill().catch(() => undefined);
    await Sandbox.kill(old.sandboxId).catch(() => undefined);
  }
});

test.run();
