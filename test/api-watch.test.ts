// files.watchDir against the real agent on the host: inotify events, recursion, the bounded
// queue's overflow event, and a reattach after the connection was reset.
import { closeSync, openSync } from 'node:fs';
import { chmod, mkdir, mkdtemp, rename, rm, unlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { AgentClient } from '../lib/agent/client.js';
import { dialUnix } from '../lib/agent/host.js';
import { createAgentApi } from '../lib/sandbox/agent-api.js';
import type { FilesystemEvent } from '../lib/sandbox/watch.js';
import { TorporError } from '../lib/errors.js';
import { hostApi, sleep, until, type HostApi } from './agent-harness.js';

let api: HostApi;
let dir: string;
test.before(async () => {
  api = await hostApi();
  dir = await mkdtemp(join(tmpdir(), 'torpor-watch-'));
});
test.after(async () => {
  await api?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const has = (events: FilesystemEvent[], type: string, name: string) => events.some((e) => e.type === type && e.name === name);

test('create, write, chmod, rename, remove; files.write shows as create + write of its name', async () => {
  const d = join(dir, 'basic');
  await mkdir(d);
  const events: FilesystemEvent[] = [];
  const h = await api.files.watchDir(d, (e) => void events.push(e));
  await writeFile(join(d, 'a.txt'), 'hello');
  await chmod(join(d, 'a.txt'), 0o600);
  await rename(join(d, 'a.txt'), join(d, 'b.txt'));
  await unlink(join(d, 'b.txt'));
  await api.files.write(join(d, 'via-api.txt'), 'x');
  await until(() => has(events, 'write', 'via-api.txt'), 5000, 'events');
  for (const [type, name] of [['create', 'a.txt'], ['write', 'a.txt'], ['chmod', 'a.txt'], ['rename', 'a.txt'], ['create', 'b.txt'], ['remove', 'b.txt'], ['create', 'via-api.txt']]) {
    assert.ok(has(events, type!, name!), `${type} ${name}: ${JSON.stringify(events)}`);
  }
  assert.not.ok(events.some((e) => e.name.includes('.torpor-')), 'the agent temporary file is not reported');
  await h.stop();
  const before = events.length;
  await writeFile(join(d, 'after-stop'), 'x');
  await sleep(100);
  assert.is(events.length, before, 'no events after stop()');
});

test('recursive: subdirectories, also ones created after the start; non-recursive ignores them', async () => {
  const d = join(dir, 'rec');
  await mkdir(join(d, 'old'), { recursive: true });
  const deep: FilesystemEvent[] = [];
  const flat: FilesystemEvent[] = [];
  const h1 = await api.files.watchDir(d, (e) => void deep.push(e), { recursive: true });
  const h2 = await api.files.watchDir(d, (e) => void flat.push(e));
  await writeFile(join(d, 'old', 'x'), '1');
  await mkdir(join(d, 'new'));
  await sleep(50); // the agent adds the new directory's watch when it sees the create
  await writeFile(join(d, 'new', 'y'), '2');
  await until(() => has(deep, 'create', 'new/y'), 5000, 'recursive events');
  assert.ok(has(deep, 'create', 'old/x'));
  assert.ok(has(flat, 'create', 'new'));
  assert.not.ok(flat.some((e) => e.name.includes('/')), JSON.stringify(flat));
  // A tree made faster than the agent sees its directories (files.write creates the parents and
  // the file in one request): what was inside a new directory before it was watched is reported.
  await api.files.write(join(d, 'fast', 'deeper', 'f.txt'), 'content');
  await until(() => has(deep, 'write', 'fast/deeper/f.txt'), 5000, 'the file inside a new tree');
  for (const name of ['fast', 'fast/deeper', 'fast/deeper/f.txt']) assert.ok(has(deep, 'create', name), name);
  await h1.stop();
  await h2.stop();
});

test('errors: a missing directory, a file; timeoutMs ends the watch and calls onExit', async () => {
  const missing = await api.files.watchDir(join(dir, 'nope'), () => undefined).catch((e) => e);
  assert.ok(missing instanceof TorporError && missing.code === 'FILE_NOT_FOUND', String(missing));
  await writeFile(join(dir, 'plain'), 'x');
  const notDir = await api.files.watchDir(join(dir, 'plain'), () => undefined).catch((e) => e);
  assert.ok(notDir instanceof TorporError && notDir.code === 'NOT_A_DIRECTORY', String(notDir));
  let exited: unknown = 'not yet';
  await api.files.watchDir(dir, () => undefined, { timeoutMs: 100, onExit: (err) => void (exited = err) });
  await until(() => exited !== 'not yet', 3000, 'onExit');
  assert.is(exited, undefined);
});

test('the directory removed ends the watch (onExit without error)', async () => {
  const d = join(dir, 'doomed');
  await mkdir(d);
  let exited: unknown = 'not yet';
  await api.files.watchDir(d, () => undefined, { onExit: (err) => void (exited = err) });
  await rm(d, { recursive: true });
  await until(() => exited !== 'not yet', 3000, 'onExit');
  assert.is(exited, undefined);
});

/** A client over the host agent whose dial can be held shut (the transport "down"). */
async function gatedClient(): Promise<{ client: AgentClient; hold(): void; release(): void }> {
  let gate: Promise<void> = Promise.resolve();
  let open = () => undefined as void;
  const client = await AgentClient.connect(async () => {
    await gate;
    return dialUnix(api.agent.socketPath);
  }, { reconnect: true });
  return {
    client,
    hold: () => {
      gate = new Promise<void>((r) => (open = r));
    },
    release: () => open(),
  };
}

test('survives a reconnect: events made while the transport was down arrive after it, once each', async () => {
  const d = join(dir, 'reconnect');
  await mkdir(d);
  const { client, hold, release } = await gatedClient();
  const files = createAgentApi(client).files;
  const events: FilesystemEvent[] = [];
  const h = await files.watchDir(d, (e) => void events.push(e));
  await writeFile(join(d, 'before'), '');
  await until(() => has(events, 'create', 'before'), 3000, 'before');
  hold();
  const back = client.reconnect();
  await writeFile(join(d, 'during'), '');
  await sleep(100);
  assert.not.ok(has(events, 'create', 'during'), 'the transport is down');
  release();
  await back;
  await writeFile(join(d, 'after'), '');
  await until(() => has(events, 'create', 'after'), 5000, 'after');
  assert.ok(has(events, 'create', 'during'), 'the event of the gap came after the reconnect');
  for (const name of ['before', 'during', 'after']) {
    assert.is(events.filter((e) => e.type === 'create' && e.name === name).length, 1, `${name} once`);
  }
  await h.stop();
  await client.close();
});

test('more events than the queue holds while nobody reads: one overflow event with the exact count', async () => {
  const d = join(dir, 'flood');
  await mkdir(d);
  const { client, hold, release } = await gatedClient();
  const events: FilesystemEvent[] = [];
  const h = await createAgentApi(client).files.watchDir(d, (e) => void events.push(e));
  hold();
  const back = client.reconnect();
  const total = 6000; // the agent keeps 4096 per watch
  for (let i = 0; i < total; i++) closeSync(openSync(join(d, `f${i}`), 'w'));
  await sleep(200); // the agent reads inotify into the watch's queue meanwhile
  release();
  await back;
  await until(() => has(events, 'create', `f${total - 1}`), 10000, 'last event');
  const over = events.filter((e) => e.type === 'overflow');
  const creates = events.filter((e) => e.type === 'create').length;
  assert.is(over.length, 1, JSON.stringify(over));
  assert.is(creates, 4096, 'the queue');
  assert.is(over[0]!.dropped, total - 4096, 'the count');
  assert.is(creates + over[0]!.dropped!, total, 'every event delivered or counted');
  await h.stop();
  await client.close();
});

test.run();
