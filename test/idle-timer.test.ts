// The lifecycle timeout's timer (lib/sandbox/idle-timer.ts) with real timers: it fires timeoutMs
// after the last activity, and never while a call waits on the guest (busy). The sandbox-level
// behaviour, a silent foreground command in a Linux guest outlasting timeoutMs, is in
// test/api-e2b-linux.test.ts.
//
// Every assertion on time is a lower bound (never sooner than timeoutMs after the last activity)
// or a wait with a generous bound: a loaded host stalls this process, and a stall longer than
// timeoutMs is idleness the timer may rightly see.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { IdleTimer } from '../lib/sandbox/idle-timer.js';
import { sleep, until } from './agent-harness.js';

// setTimeout fires no sooner than its delay, which Node rounds to the millisecond; Date.now() has
// millisecond steps: 2 ms of slack on a lower bound.
const SLACK_MS = 2;

test('fires once, no sooner than timeoutMs after start, and not after stop', async () => {
  const fired: number[] = [];
  const t = new IdleTimer(50, () => fired.push(Date.now()));
  const started = Date.now();
  t.start();
  await until(() => fired.length > 0, 5_000, 'the firing');
  assert.is(fired.length, 1);
  assert.ok(fired[0]! - started >= 50 - SLACK_MS, `fired ${fired[0]! - started} ms after start`);
  assert.is(t.deadline, null, 'fired: stopped');
  t.start();
  t.stop();
  await sleep(100);
  assert.is(fired.length, 1, 'stopped: no second firing');
  assert.is(t.deadline, null);
});

test('touch() moves the deadline: it fires no sooner than timeoutMs after the touch before it', async () => {
  const fired: number[] = [];
  const t = new IdleTimer(200, () => fired.push(Date.now()));
  const touches = [Date.now()];
  t.start();
  for (let i = 0; i < 15; i++) {
    await sleep(20);
    t.touch();
    touches.push(Date.now());
    assert.ok(t.deadline!.getTime() >= touches.at(-1)! + 200 - SLACK_MS, 'the deadline is timeoutMs after the touch');
  }
  await until(() => fired.length > 0, 5_000, 'the firing');
  assert.is(fired.length, 1);
  // Touched every 20 ms for 300 ms, longer than timeoutMs: without touch() it would have fired at
  // 200 ms, sooner than 200 ms after the touch before it.
  const before = Math.max(...touches.filter((at) => at <= fired[0]!));
  assert.ok(fired[0]! - before >= 200 - SLACK_MS, `fired ${fired[0]! - before} ms after the touch before it`);
});

test('while busy it does not fire; after it, it fires no sooner than timeoutMs after the touch that ends it', async () => {
  let firedAt = 0;
  let busy = true;
  const t = new IdleTimer(40, () => (firedAt = Date.now()), () => busy);
  t.start();
  await sleep(150);
  assert.is(firedAt, 0, 'busy for more than three times timeoutMs');
  assert.ok(t.deadline!.getTime() >= Date.now() + 40 - SLACK_MS, 'while busy the deadline is timeoutMs ahead, not in the past');
  // The sandbox touches the timer when a foreground command ends (lib/sandbox/sandbox.ts).
  busy = false;
  t.touch();
  const freed = Date.now();
  await until(() => firedAt > 0, 5_000, 'the firing');
  assert.ok(firedAt > 0, 'fired once no longer busy');
  assert.ok(firedAt - freed >= 40 - SLACK_MS, `fired ${firedAt - freed} ms after the end of the busy call`);
  t.stop();
});

test.run();
