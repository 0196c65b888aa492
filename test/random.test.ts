// lib/random.ts: bytes handed out from a pool are each handed out once, copied out (a caller
// that changes its buffer changes no other's), across refills of the pool and past its size.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { randomBytes, randomHex } from '../lib/random.js';

test('draws across several refills are distinct, of the asked length, and not views of one pool', () => {
  const seen = new Set<string>();
  const draws: Buffer[] = [];
  for (let i = 0; i < 3000; i++) {
    const b = randomBytes(8 + (i % 57)); // 8..64 bytes: ~100 KiB in all, many refills
    assert.is(b.length, 8 + (i % 57));
    const hex = b.subarray(0, 8).toString('hex');
    assert.not.ok(seen.has(hex), `a repeated draw at ${i}`);
    seen.add(hex);
    draws.push(b);
  }
  const before = Buffer.from(draws[1]!);
  draws[0]!.fill(0);
  draws[2]!.fill(0);
  assert.ok(draws[1]!.equals(before));
});

test('more than a pool, zero bytes, hex, and bad counts', () => {
  const big = randomBytes(10_000);
  assert.is(big.length, 10_000);
  assert.ok(big.some((x) => x !== 0));
  assert.is(randomBytes(0).length, 0);
  assert.match(randomHex(4), /^[0-9a-f]{8}$/);
  assert.throws(() => randomBytes(-1), /not a byte count/);
  assert.throws(() => randomBytes(1.5), /not a byte count/);
});

test.run();
