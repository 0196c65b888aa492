// Cancellation (issue 24): `signal: AbortSignal` on every call that can wait. An abort rejects
// with AbortError (name 'AbortError', code ABORTED) and leaves nothing half-done: a foreground
// command is killed, a file write leaves no file, a create leaves no sandbox, a connect leaves
// it paused, a pause leaves it running. Commands and files run against the real agent on the
// host; the sandbox calls against real sandboxes (the test guest, in a private TORPOR_HOME).
// Also here: lifecycle.autoResume, the next call after an idle pause resuming the sandbox.
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { AbortError, TorporError } from '../lib/errors.js';
import { Sandbox } from '../lib/sandbox/sandbox.js';
import { hostApi, sleep, until, type HostApi } from './agent-harness.js';
import { privateHome, testvmSandboxTest } from './sandbox-home.js';
import { testvmImage } from './vmm-guests.js';

const kvmTest = await testvmSandboxTest('api-abort');
const kernel = testvmImage();
const testGuest = { template: false as const, memoryMB: 64, cpuCount: 1, boot: { kernel: kernel!, timeoutMs: 15_000, cmdlineExtra: 'testvm.agent_ready=1' } };

const home = privateHome(test, 'torpor-abort-');

let api: HostApi;
test.before(async () => {
  api = await hostApi();
});
test.after(async () => {
  await api?.close();
});

const isAbort = (e: unknown) => e instanceof AbortError && e.code === 'ABORTED' && e.name === 'AbortError';
const abortIn = (ms: number) => AbortSignal.timeout(ms);
const running = async (tag: string) => (await api.commands.list()).filter((p) => p.tag === tag);

test('commands.run: an abort kills the foreground process group and rejects AbortError with the reason as cause', async () => {
  const ctl = new AbortController();
  const t0 = Date.now();
  const run = api.commands.run('sleep 60 & sleep 60; wait', { tag: 'aborted-run', signal: ctl.signal });
  await until(async () => (await running('aborted-run')).length === 1, 5000, 'started');
  ctl.abort(new Error('the user went away'));
  const err = await run.catch((e: unknown) => e);
  assert.ok(isAbort(err), String(err));
  assert.is(((err as Error).cause as Error).message, 'the user went away');
  assert.ok(Date.now() - t0 < 10_000, 'not waited for the sleep');
  assert.equal(await running('aborted-run'), [], 'the process is gone when the call rejects');

  // Already aborted: nothing starts.
  const before = await api.commands.run(['true'], { tag: 'never-ran', signal: AbortSignal.abort() }).catch((e: unknown) => e);
  assert.ok(isAbort(before), String(before));
  assert.is((await api.commands.list({ includeEnded: true })).filter((p) => p.tag === 'never-ran').length, 0);

  // A signal that never aborts changes nothing.
  const ok = await api.commands.run(['echo', 'hi'], { signal: new AbortController().signal });
  assert.is(ok.stdout, 'hi\n');
});

test('handle.wait({ signal }) stops waiting only: the process runs on and can be waited for again', async () => {
  const h = await api.commands.run('read line; echo got $line', { background: true, stdin: true, tag: 'waited' });
  const err = await h.wait({ signal: abortIn(100) }).catch((e: unknown) => e);
  assert.ok(isAbort(err), String(err));
  assert.is((await running('waited')).length, 1, 'still running');
  await h.sendStdin('x\n');
  assert.is((await h.wait()).stdout, 'got x\n');
  // A background run's signal bounds its start only.
  const bg = await api.commands.run(['sleep', '30'], { background: true, signal: abortIn(200), tag: 'bg' });
  await sleep(400);
  assert.is((await running('bg')).length, 1, 'a started background process is not the signal\'s');
  await bg.kill();
});

test('files: an aborted write leaves no file and no temporary file; calls refuse an aborted signal; a bad signal is INVALID_ARGUMENT', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-abort-files-'));
  try {
    const ctl = new AbortController();
    // A stream that sends 64 KiB and then waits: the abort comes with bytes still to go.
    async function* slow() {
      yield new Uint8Array(64 * 1024);
      await sleep(60_000);
      yield new Uint8Array(1);
    }
    const target = join(dir, 'half.bin');
    setTimeout(() => ctl.abort(), 200);
    const err = await api.files.write(target, slow() as AsyncIterable<Uint8Array>, { signal: ctl.signal }).catch((e: unknown) => e);
    assert.ok(isAbort(err), String(err));
    await until(() => readdirSync(dir).length === 0, 5000, 'the temporary file removed');
    assert.equal(readdirSync(dir), [], 'no file, no temporary file');

    for (const call of [
      () => api.files.list(dir, { signal: AbortSignal.abort() }),
      () => api.files.read(join(dir, 'x'), { signal: AbortSignal.abort() }),
      () => api.files.write(join(dir, 'y'), 'y', { signal: AbortSignal.abort() }),
      () => api.files.makeDir(join(dir, 'z'), { signal: AbortSignal.abort() }),
    ]) {
      const e = await call().catch((x: unknown) => x);
      assert.ok(isAbort(e), String(e));
    }
    assert.equal(readdirSync(dir), [], 'nothing was done');
    const written = await api.files.write(join(dir, 'ok'), 'ok', { signal: new AbortController().signal });
    assert.is(written.name, 'ok');

    const bad = await api.files.list(dir, { signal: 'soon' as never }).catch((e: unknown) => e);
    assert.ok(bad instanceof TorporError && bad.code === 'INVALID_ARGUMENT', String(bad));
    assert.match((bad as Error).message, /opts\.signal must be an AbortSignal/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

kvmTest('Sandbox.create, pause and connect: an abort leaves no sandbox, a running one, a paused one', async () => {
  const dirs = () => (existsSync(join(home, 'sandboxes')) ? readdirSync(join(home, 'sandboxes')).sort() : []);
  // create: already aborted, and aborted while the machine boots (it is killed, its directory removed).
  const before = await Sandbox.create({ ...testGuest, signal: AbortSignal.abort() }).catch((e: unknown) => e);
  assert.ok(isAbort(before), String(before));
  const existing = dirs();
  const midway = await Sandbox.create({ ...testGuest, signal: abortIn(5) }).catch((e: unknown) => e);
  if (midway instanceof Sandbox) await midway.kill(); // the machine was up in 5 ms: nothing to abort
  else assert.ok(isAbort(midway), String(midway));
  assert.equal(dirs(), existing, 'no sandbox left behind');

  const sbx = await Sandbox.create(testGuest);
  try {
    // pause: aborted before its capture, the sandbox runs on (the Linux guest's test aborts one
    // that waits for a foreground command: sandbox-linux-pause).
    const p = await sbx.pause({ signal: AbortSignal.abort() }).catch((e: unknown) => e);
    assert.ok(isAbort(p), String(p));
    assert.is(sbx.state, 'running');
    assert.is((await sbx.pause()).generation, 1);

    // connect (and resume in place): aborted, the sandbox is paused still, and connects after.
    const c = await Sandbox.connect(sbx.sandboxId, { signal: AbortSignal.abort() }).catch((e: unknown) => e);
    assert.ok(isAbort(c), String(c));
    assert.is((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused');
    const r = await sbx.resume({ signal: abortIn(1) }).catch((e: unknown) => e);
    if (r === sbx) await sbx.pause(); // resumed within 1 ms: nothing to abort
    else assert.ok(isAbort(r), String(r));
    assert.is(sbx.state, 'paused');
    assert.is((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused');
    assert.is(await sbx.resume(), sbx);
    assert.is(sbx.state, 'running');
  } finally {
    await Sandbox.kill(sbx.sandboxId).catch(() => undefined);
  }
});

kvmTest('lifecycle.autoResume: the next call after an idle pause resumes the sandbox first; an explicit pause stays paused', async () => {
  const bad = await Sandbox.create({ ...testGuest, lifecycle: { autoResume: true } }).catch((e: unknown) => e);
  assert.ok(bad instanceof TorporError && bad.code === 'INVALID_ARGUMENT', String(bad));
  const sbx = await Sandbox.create({ ...testGuest, timeoutMs: 300, lifecycle: { onTimeout: 'pause', autoResume: true } });
  const seen: string[] = [];
  sbx.on('paused', (e) => seen.push(`paused ${e.cause}`));
  sbx.on('resumed', (e) => seen.push(`resumed ${e.from}`));
  try {
    const alive = setInterval(() => undefined, 1000); // the idle timer does not keep the process alive
    await new Promise((r) => sbx.once('paused', r)).finally(() => clearInterval(alive));
    assert.is(sbx.state, 'paused');
    // Three calls at once: one resume, then each goes on to the agent (the test guest's offers no
    // exec, so each is refused for that, not for the pause; the Linux guest's test runs them).
    const results = await Promise.all([1, 2, 3].map(() => sbx.commands.run(['true']).catch((e: unknown) => e)));
    for (const r of results) assert.ok(r instanceof TorporError && r.code === 'REQUEST_FAILED' && /does not offer exec/.test(r.message), String(r));
    assert.is(sbx.state, 'running');
    assert.equal(seen, ['paused timeout', 'resumed memory']);
    assert.is((await sbx.getInfo()).generation, 1);

    await sbx.pause();
    const refused = await sbx.commands.run(['true']).catch((e: unknown) => e);
    assert.ok(refused instanceof TorporError && refused.code === 'INVALID_STATE', String(refused));
    assert.is(sbx.state, 'paused', 'a pause the caller asked for is not undone by a call');
  } finally {
    await Sandbox.kill(sbx.sandboxId).catch(() => undefined);
  }
});

test.run();
