// The lifecycle timeout's timer (lib/sandbox/idle-timer.ts) with real timers: it fires timeoutMs
// after the last activity, and never while a call waits on the guest (busy). The sandbox-level
// behaviour, a silent foreground command in a Linux guest outlasting timeoutMs, is in
// test/api-e2b-linux.test.ts.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { IdleTimer } from '../lib/sandbox/idle-timer.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('fires once, timeoutMs after start, and not after stop', async () => {
  let fired = 0;
  const t = new IdleTimer(50, () => fired++);
  t.start();
  await sleep(20);
  assert.is(fired, 0);
  await sleep(80);
  assert.is(fired, 1);
  t.start();
  t.stop();
  await sleep(100);
  assert.is(fired, 1, 'stopped: no second firing');
  assert.is(t.deadline, null);
});

test('touch() moves the deadline: activity keeps it from firing', async () => {
  let fired = 0;
  const t = new IdleTimer(60, () => fired++);
  t.start();
  for (let i = 0; i < 5; i++) {
    await sleep(30);
    t.touch();
  }
  assert.is(fired, 0, 'touched every 30 ms of 60');
  await sleep(120);
  assert.is(fired, 1);
});

test('while busy it does not fire; it fires timeoutMs after the last check that found it busy', async () => {
  let firedAt = 0;
  let busy = true;
  let lastBusy = 0;
  const t = new IdleTimer(40, () => (firedAt = Date.now()), () => {
    if (busy) lastBusy = Date.now();
    return busy;
  });
  t.start();
  await sleep(150);
  assert.is(firedAt, 0, 'busy for more than three times timeoutMs');
  assert.ok(lastBusy > 0, 'the timer asked');
  assert.ok(t.deadline!.getTime() >= Date.now() + 40 - 2, 'while busy the deadline is timeoutMs ahead, not in the past');
  busy = false;
  const freed = Date.now();
  while (firedAt === 0 && Date.now() - freed < 1_000) await sleep(5);
  assert.ok(firedAt > 0, 'fired once no longer busy');
  // Node rounds a timer's delay to the millisecond: allow 2 ms.
  assert.ok(firedAt - lastBusy >= 38, `fired ${firedAt - lastBusy} ms after the last busy check`);
  t.stop();
});

test.run();
