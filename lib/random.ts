// Random bytes for names (sandbox ids, temporaries, fork bases) and protocol fields (request
// ids, a RESUMED's entropy), handed out from a pool the CSPRNG refills 4 KiB at a time. A
// synchronous crypto.randomBytes() is a crypto job of its own: ~30 us when called now and then
// (measured on the PVM host; ~5 us in a tight loop), and a fork's child drew five of them on the
// JS thread. Node's randomUUID() pools the same way. Every byte is handed out once, copied out
// of the pool and zeroed there, so no two callers share bytes and none stays behind.
import { randomFillSync } from 'node:crypto';

const POOL_BYTES = 4096;
const pool = Buffer.allocUnsafeSlow(POOL_BYTES);
let next = POOL_BYTES; // empty: filled at the first draw

/** `n` fresh random bytes (a new Buffer of its own). */
export function randomBytes(n: number): Buffer {
  if (!Number.isInteger(n) || n < 0) throw new RangeError(`randomBytes: ${n} is not a byte count`);
  if (n > POOL_BYTES) return randomFillSync(Buffer.allocUnsafe(n));
  if (next + n > POOL_BYTES) {
    randomFillSync(pool);
    next = 0;
  }
  const out = Buffer.allocUnsafe(n);
  pool.copy(out, 0, next, next + n);
  pool.fill(0, next, next + n); // a RESUMED's entropy is the guest's alone: not left in the pool
  next += n;
  return out;
}

/** `bytes` random bytes as lowercase hex (2 x `bytes` characters). */
export function randomHex(bytes: number): string {
  return randomBytes(bytes).toString('hex');
}
