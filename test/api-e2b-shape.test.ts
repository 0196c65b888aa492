// The Sandbox-level API in E2B's shapes (issue 24): create(template, opts), E2B's option and
// info names, E2B keys with no meaning here ignored with a one-time warning, and list() as a
// paginator that is still awaitable as an array. The sandboxes are real (the test guest standing
// in for Linux, in a private TORPOR_HOME); the option handling is checked on its own too.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { Sandbox, type SandboxInfo } from '../lib/sandbox/sandbox.js';
import { normalizeCreateArgs } from '../lib/sandbox/sandbox-options.js';
import { privateHome, testvmSandboxTest } from './sandbox-home.js';
import { testvmImage } from './vmm-guests.js';

const kvmTest = await testvmSandboxTest('api-e2b-shape');
const kernel = testvmImage()!;
const testGuest = { template: false as const, boot: { kernel, timeoutMs: 15_000, cmdlineExtra: 'testvm.agent_ready=1' } };

privateHome(test, 'torpor-e2b-shape-');

const refusal = (fn: () => unknown) => {
  try {
    fn();
  } catch (err) {
    return err as TorporError;
  }
  return null;
};

test("create's arguments: E2B's (template, opts), cpuCount/memoryMB as aliases, conflicts refused", () => {
  assert.equal(normalizeCreateArgs('node22', { timeoutMs: 5000 }), { template: 'node22', timeoutMs: 5000 });
  assert.equal(normalizeCreateArgs({ cpuCount: 2, memoryMB: 1024 }, undefined), { vcpus: 2, memoryMiB: 1024 });
  assert.equal(normalizeCreateArgs({ cpuCount: 2, vcpus: 2 }, undefined), { vcpus: 2 });
  for (const [a, b, says] of [
    ['node22', { template: 'other' }, /opts\.template must be absent or equal to the template argument/],
    [{ cpuCount: 2, vcpus: 4 }, undefined, /opts\.cpuCount must be equal to opts\.vcpus \(4\)/],
    [{}, { timeoutMs: 1 }, /opts must be the only argument/],
  ] as const) {
    const err = refusal(() => normalizeCreateArgs(a, b));
    assert.ok(err instanceof TorporError && err.code === 'INVALID_ARGUMENT', String(err));
    assert.match(err!.message, says);
  }
});

test("E2B's apiKey, domain and secure are ignored, each with one warning per process", async () => {
  const warnings: string[] = [];
  const onWarning = (w: Error & { code?: string }) => {
    if (w.code === 'TORPOR_E2B_OPTION') warnings.push(w.message);
  };
  process.on('warning', onWarning);
  try {
    assert.equal(normalizeCreateArgs({ apiKey: 'e2b_x', domain: 'e2b.app', secure: true, timeoutMs: 9 }, undefined), { timeoutMs: 9 });
    assert.equal(normalizeCreateArgs({ apiKey: 'again' }, undefined), {});
    await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
    assert.is(warnings.length, 3, warnings.join('\n'));
    assert.ok(warnings.every((w) => /has no meaning in torpor/.test(w)));
  } finally {
    process.off('warning', onWarning);
  }
});

test('Sandbox.create(name) with no such template: TEMPLATE_NOT_FOUND naming it, on every host', async () => {
  const err = await Sandbox.create('no-such-template', { timeoutMs: 1000 }).catch((e: unknown) => e);
  assert.ok(err instanceof TorporError && err.code === 'TEMPLATE_NOT_FOUND', String(err));
  assert.match((err as Error).message, /no-such-template/);
});

kvmTest("list() pages with hasNext/nextItems, iterates, awaits as an array; info has E2B's names", async () => {
  const made: Sandbox[] = [];
  try {
    for (let i = 0; i < 3; i++) made.push(await Sandbox.create({ ...testGuest, memoryMB: 64, cpuCount: 1, metadata: { n: String(i) } }));
    await made[0]!.pause();
    await made[1]!.setTimeout(60_000);

    const pages = Sandbox.list({ limit: 2 });
    assert.ok(pages.hasNext, 'before the first page');
    const first = await pages.nextItems();
    assert.is(first.length, 2);
    assert.ok(pages.hasNext);
    const second = await pages.nextItems();
    assert.is(second.length, 1);
    assert.not.ok(pages.hasNext);
    assert.equal(await pages.nextItems(), []);
    const ids = new Set(made.map((s) => s.sandboxId));
    assert.equal(new Set([...first, ...second].map((s) => s.sandboxId)), ids);

    const walked: SandboxInfo[] = [];
    for await (const info of Sandbox.list({ state: 'running' })) walked.push(info);
    assert.equal(walked.map((i) => i.sandboxId).sort(), [made[1]!.sandboxId, made[2]!.sandboxId].sort());
    assert.is((await Sandbox.list()).length, 3, 'await list() is the array, as before');

    const info = await made[1]!.getInfo();
    assert.is(info.templateId, info.template);
    assert.equal(info.resources.cpu, 1);
    assert.equal(info.memoryMiB, 64);
    assert.ok(info.startedAt.getTime() >= info.createdAt.getTime());
    assert.ok(info.endAt && Math.abs(info.endAt.getTime() - (Date.now() + 60_000)) < 10_000, `endAt ${info.endAt?.toISOString()}`);
    assert.is((await made[2]!.getInfo()).endAt, undefined, 'no timeout, no end');
  } finally {
    for (const s of made) await Sandbox.kill(s.sandboxId).catch(() => undefined);
  }
});

kvmTest('pause leaves the object usable: resume() and connect() continue the same object; a stale one refuses with a code', async () => {
  const sbx = await Sandbox.create({ ...testGuest, memoryMB: 64, cpuCount: 1 });
  const id = sbx.sandboxId;
  try {
    await sbx.pause();
    assert.is(await sbx.resume(), sbx);
    assert.is(sbx.state, 'running');
    assert.is((await sbx.getInfo()).resumedFrom, 'memory');
    assert.is(await sbx.resume(), sbx, 'a running sandbox resolves at once');
    await sbx.pause();
    assert.is(await sbx.connect(), sbx, "E2B's instance connect");
    assert.is(sbx.state, 'running');

    // Sandbox.connect(id) after a pause makes the object that holds it from then on: the old one is stale.
    await sbx.pause();
    const other = await Sandbox.connect(id);
    assert.is.not(other, sbx);
    const stale = await sbx.resume().catch((e: unknown) => e);
    assert.ok(stale instanceof TorporError && stale.code === 'INVALID_STATE', String(stale));
    assert.match((stale as Error).message, /another Sandbox object/);
    assert.ok(other.isRunning(), 'the stale object touched nothing');

    await other.kill();
    const killed = await other.resume().catch((e: unknown) => e);
    assert.ok(killed instanceof TorporError && killed.code === 'INVALID_STATE', String(killed));
  } finally {
    await Sandbox.kill(id).catch(() => undefined);
  }
});

kvmTest('events: paused and resumed with their cause, the idle timeout saying so, killed, and exit when the guest dies', async () => {
  const sbx = await Sandbox.create({ ...testGuest, memoryMB: 64, cpuCount: 1 });
  const seen: string[] = [];
  sbx.on('paused', (e) => seen.push(`paused ${e.cause} ${e.generation}`));
  sbx.on('resumed', (e) => seen.push(`resumed ${e.from}`));
  sbx.on('killed', (e) => seen.push(`killed ${e.cause}`));
  try {
    await sbx.pause();
    await sbx.resume();
    await sbx.setTimeout(300, { onTimeout: 'pause' });
    // The idle timer does not keep the process alive (beforeExit would pause it first): this does.
    const alive = setInterval(() => undefined, 1000);
    const idle = await new Promise((r) => sbx.once('paused', r)).finally(() => clearInterval(alive));
    assert.equal(idle, { sandboxId: sbx.sandboxId, generation: 2, cause: 'timeout' });
    await sbx.resume();
    await sbx.kill();
    assert.equal(seen, ['paused call 1', 'resumed memory', 'paused timeout 2', 'resumed memory', 'killed call']);

    const dies = await Sandbox.create({ ...testGuest, memoryMB: 64, cpuCount: 1 });
    const exited = new Promise<{ state: string; kind: string }>((r) => dies.once('exit', r));
    (dies as unknown as { machine: { consoleWrite(s: string): void } }).machine.consoleWrite('triple\n');
    const alive2 = setInterval(() => undefined, 1000);
    const exit = await exited.finally(() => clearInterval(alive2));
    assert.is(exit.kind, 'triple-fault');
    assert.is(dies.state, 'failed');
    await dies.kill();
  } finally {
    await Sandbox.kill(sbx.sandboxId).catch(() => undefined);
  }
});

test.run();
