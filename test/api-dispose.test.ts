// `await using` on what the API hands out (issue 24): a command or pty handle kills its process
// at the end of the scope, a watch stops, and a sandbox is killed (the default) or, with
// `onDispose: 'pause'`, paused and kept. Handles run against the agent as a host process; the
// sandbox is the test guest standing in for Linux, in a private TORPOR_HOME.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Sandbox } from '../lib/sandbox/sandbox.js';
import { hostApi, sleep, until, type HostApi } from './agent-harness.js';
import { privateHome, testvmSandboxTest } from './sandbox-home.js';
import { testvmImage } from './vmm-guests.js';

const kvmTest = await testvmSandboxTest('api-dispose');
const testGuest = { template: false as const, vcpus: 1, memoryMiB: 64, boot: { kernel: testvmImage()!, timeoutMs: 15_000, cmdlineExtra: 'testvm.agent_ready=1' } };
privateHome(test, 'torpor-dispose-');

let api: HostApi;
test.before(async () => {
  api = await hostApi();
});
test.after(async () => {
  await api?.close();
});

const running = async (pid: number) => (await api.commands.list()).some((p) => p.pid === pid && p.running);

test('a command handle and a pty handle kill their process at the end of the scope; a watch stops', async () => {
  let pid = 0;
  {
    await using cmd = await api.commands.run('sleep 300', { background: true });
    pid = cmd.pid;
    assert.ok(await running(pid));
  }
  await until(async () => !(await running(pid)));

  let ptyPid = 0;
  {
    await using term = await api.pty.create({ cols: 80, rows: 24, onData: () => undefined, cmd: ['sleep', '300'] });
    ptyPid = term.pid;
  }
  await until(async () => !(await running(ptyPid)));

  const dir = `/tmp/torpor-dispose-${process.pid}`;
  await api.files.makeDir(dir);
  const events: string[] = [];
  {
    await using _watch = await api.files.watchDir(dir, (e) => void events.push(e.name));
    await api.files.write(`${dir}/inside`, 'x');
    await until(() => events.includes('inside'));
  }
  await api.files.write(`${dir}/after`, 'y');
  await sleep(300);
  assert.not.ok(events.includes('after'), 'a stopped watch reports nothing');
  await api.files.remove(dir);
});

kvmTest("a sandbox is killed at the end of its scope, or paused with onDispose: 'pause'", async () => {
  let killedId = '';
  {
    await using sbx = await Sandbox.create(testGuest);
    killedId = sbx.sandboxId;
  }
  assert.not.ok(existsSync(join(process.env.TORPOR_HOME!, 'sandboxes', killedId)), 'killed: its files are gone');

  let id = '';
  {
    await using kept = await Sandbox.create({ ...testGuest, onDispose: 'pause' });
    id = kept.sandboxId;
  }
  assert.is((await Sandbox.getInfo(id)).state, 'paused');
  {
    await using back = await Sandbox.connect(id, { onDispose: 'pause' });
    assert.is(back.onDispose, 'pause');
    back.onDispose = 'kill';
  }
  assert.equal(await Sandbox.list(), []);
  const bad = await Sandbox.create({ ...testGuest, onDispose: 'keep' as never }).catch((e: unknown) => e);
  assert.match(String(bad), /opts\.onDispose must be 'kill' or 'pause'/);
});

test.run();
