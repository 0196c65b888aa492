// The command line driving a Linux sandbox another process left paused: `torpor exec` (output
// and exit status passed through), `torpor logs` (a background process's kept output and its
// status), `torpor shell` (a pty), each resuming the sandbox from memory and pausing it again.
// Runs where a Linux guest can boot (a hardware-virtualization host, or the nested host of
// `npm run test:linux`); elsewhere registered as skipped, category linux-guest, with the reason.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { NESTED } from './bounds.js';
import { runTorpor } from './fixtures/cli.js';
import { testUnless } from './skip-unless.js';

const support = await linuxGuestSupport();
const linuxTest = testUnless('cli-linux', support.ok ? null : `this host cannot boot a Linux guest: ${support.reason}`, 'linux-guest');

const BOOT = { boot: { timeoutMs: 180_000 }, memoryMiB: 256, vcpus: 1 };
/** A CLI run: a Node start with tsx and a restore, emulated in the nested host. */
const CLI_MS = NESTED ? 300_000 : 60_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

const torpor = (...args: string[]) => runTorpor(CLI_MS, ...args);

linuxTest('exec, logs and shell on a sandbox another process left paused: output, exit status, paused again, processes kept', async () => {
  const sbx = await Sandbox.create(BOOT);
  const id = sbx.sandboxId;
  try {
    await sbx.files.write('/home/user/note.txt', 'left by the creator\n');
    const job = await sbx.commands.run('for i in 1 2 3; do echo line-$i; done; echo oops >&2; sleep 2; echo last; exit 4', { background: true });
    await sleep(500);
    await sbx.pause();

    const exec = await torpor('exec', id, '--', 'sh', '-c', 'cat /home/user/note.txt; echo to-stderr >&2; exit 7');
    assert.is(exec.status, 7, exec.stderr);
    assert.is(exec.stdout, 'left by the creator\n');
    assert.match(exec.stderr, /to-stderr/);
    let info = await Sandbox.getInfo(id);
    assert.is(info.state, 'paused', 'exec paused it again');
    assert.is(info.ownerPid, null);

    const logs = await torpor('logs', id, String(job.pid));
    assert.is(logs.status, 4, logs.stderr);
    assert.is(logs.stdout, 'line-1\nline-2\nline-3\nlast\n', 'the kept output, then the rest, from the same process');
    assert.match(logs.stderr, /oops/);

    const shell = await torpor('shell', id, '--cmd', 'echo "pty:$(tty | cut -c1-8)"; exit 3');
    assert.is(shell.status, 3, shell.stderr);
    assert.match(shell.stdout, /pty:\/dev\/pts/);

    info = await Sandbox.getInfo(id);
    assert.is(info.state, 'paused');
    const back = await Sandbox.connect(id, { restoreTimeoutMs: 120_000, bootTimeoutMs: 180_000 });
    assert.is((await back.getInfo()).resumedFrom, 'memory', 'every CLI run resumed and paused the same machine');
    assert.is(await back.files.read('/home/user/note.txt'), 'left by the creator\n');
    await back.kill();
  } finally {
    await Sandbox.kill(id).catch(() => undefined);
  }
});

test.run();
