// Content hashes for artifact keys and integrity checks.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { open } from 'node:fs/promises';

export function sha256(data: string | Uint8Array): string {
  return createHash('sha256').update(data).digest('hex');
}

/** Streams a whole file through sha256 (kernels and images are tens to hundreds of MB). */
export async function sha256File(path: string): Promise<string> {
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(path, { highWaterMark: 1 << 20 })) {
    hash.update(chunk as Buffer);
  }
  return hash.digest('hex');
}

/** Bytes hashed at each end of a file by headHash(). */
export const HEAD_HASH_SPAN = 64 * 1024;

/**
 * A cheap fingerprint read on every use: sha256 over the size and the first and
 * last 64 KiB. Catches truncation, a file swapped for another and the headers
 * a loader reads (ELF, ext4 superblock), for the cost of two small reads.
 */
export async function headHash(path: string): Promise<string> {
  const fh = await open(path, 'r');
  try {
    const { size } = await fh.stat();
    const hash = createHash('sha256');
    hash.update(`${size}:`);
    const headLen = Math.min(size, HEAD_HASH_SPAN);
    const head = Buffer.alloc(headLen);
    await fh.read(head, 0, headLen, 0);
    hash.update(head);
    if (size > HEAD_HASH_SPAN) {
      const tailLen = Math.min(size - HEAD_HASH_SPAN, HEAD_HASH_SPAN);
      const tail = Buffer.alloc(tailLen);
      await fh.read(tail, 0, tailLen, size - tailLen);
      hash.update(tail);
    }
    return hash.digest('hex');
  } finally {
    await fh.close();
  }
}
