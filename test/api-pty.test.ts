// pty.create against the real agent on the host: echo, resize, exit.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { createAgentApi } from '../lib/sandbox/agent-api.js';
import { hostApi, until, type HostApi } from './agent-harness.js';

let api: HostApi;
test.before(async () => {
  api = await hostApi();
});
test.after(async () => {
  await api?.close();
});

test('pty: echo, stty size before and after resize, exit', async () => {
  let screen = '';
  const term = await api.pty.create({
    cols: 80,
    rows: 24,
    cmd: ['/bin/sh'],
    envs: { PS1: '$ ' },
    onData: (d) => {
      screen += Buffer.from(d).toString('utf8');
    },
  });
  assert.ok(term.pid > 0);
  await term.sendInput('stty size\n');
  await until(() => /24 80/.test(screen), 5000, 'stty size 24 80');
  await term.sendInput('echo hi-$((40+2))\n');
  await until(() => screen.includes('hi-42'), 5000, 'echo');
  assert.ok(screen.includes('echo hi-$((40+2))'), 'the terminal echoes input');
  await term.resize({ cols: 120, rows: 40 });
  await term.sendInput('stty size\n');
  await until(() => /40 120/.test(screen), 5000, 'stty size 40 120');
  await term.sendInput('exit 5\n');
  const r = await term.wait();
  assert.is(r.exitCode, 5);
});

test('pty: kill, and invalid sizes', async () => {
  const term = await api.pty.create({ cols: 80, rows: 24, cmd: ['/bin/sh'], onData: () => undefined });
  assert.is(await term.kill(), true);
  const r = await term.wait();
  assert.is(r.signal, 'SIGKILL');
  const bad = await api.pty.create({ cols: 0, rows: 24, onData: () => undefined }).catch((e) => e);
  assert.ok(bad instanceof TorporError && bad.code === 'INVALID_ARGUMENT');
});

test("the sandbox's envs reach a pty too, and the pty's own envs win", async () => {
  const withDefaults = createAgentApi(api.client, { envs: { SBX_A: 'from-sandbox', SBX_B: 'from-sandbox' } });
  let screen = '';
  const term = await withDefaults.pty.create({
    cols: 80,
    rows: 24,
    cmd: ['/bin/sh', '-c', 'echo "A=$SBX_A B=$SBX_B"'],
    envs: { SBX_B: 'from-pty' },
    onData: (d) => {
      screen += Buffer.from(d).toString('utf8');
    },
  });
  await term.wait();
  assert.match(screen, /A=from-sandbox B=from-pty/);
});

test.run();
