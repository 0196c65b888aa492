// The content-addressed blob cache every image source writes into: <home>/images/blobs/sha256/<hex>,
// shared by all templates, so two images on one base layer download and keep it once.
//
// A blob is only ever visible under its digest once its size and sha256 are checked: bytes land
// in a temporary name in the same directory (so the final rename is atomic), are fsync'd, and
// renamed into place read-only. Nothing takes a lock, so this works without the native addon and
// across processes: a download owns a private temporary name (<hex>.partial.<pid>.<random>) and
// takes over an interrupted one by renaming <hex>.partial (or a dead process's private name) to
// its own, which only one process can win. Two processes fetching one blob at once at worst both
// download it; the renames into place are of identical bytes.
import { createHash, type Hash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { chmod, mkdir, open, readdir, rename, rm, stat, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';

import { TorporError } from '../errors.js';
import { fsyncPath } from '../store/fsync.js';
import { torporHome } from '../store/home.js';
import { processAlive } from '../store/process-alive.js';
import type { ImageProgress } from './types.js';
import { randomHex } from '../random.js';

const DIGEST = /^sha256:([a-f0-9]{64})$/;

/** `<home>/images/blobs/sha256`. */
export function blobDir(home: string = torporHome()): string {
  return join(home, 'images', 'blobs', 'sha256');
}

export function digestHex(digest: string): string {
  const m = DIGEST.exec(digest);
  if (!m) throw new TorporError('INVALID_ARGUMENT', `not a sha256 digest: ${JSON.stringify(digest)}`);
  return m[1]!;
}

export interface BlobDownload {
  digest: string;
  size: number;
  /** Names the image in BLOB_CORRUPT messages. */
  image: string;
  /**
   * Opens the blob from byte `offset` on (a Range request when offset > 0). The answer's status
   * says what came: 206 continues at offset, 200 is the whole blob again.
   */
  open: (offset: number) => Promise<Response>;
  onProgress?: (p: ImageProgress) => void;
  /** Re-hash a cached blob instead of trusting its size. */
  verify?: boolean;
  signal?: AbortSignal;
}

/** A failure of the transfer itself (reset, abort): the partial file is worth resuming. */
class TransferInterrupted extends Error {}

function corrupt(digest: string, image: string, why: string): TorporError {
  return new TorporError('BLOB_CORRUPT', `blob ${digest} of ${image} is corrupt: ${why}; the partial download was removed, so a retry fetches it afresh`);
}

async function hashFile(path: string, hash: Hash): Promise<number> {
  let n = 0;
  for await (const chunk of createReadStream(path)) {
    hash.update(chunk as Buffer);
    n += (chunk as Buffer).length;
  }
  return n;
}

async function writeAll(fh: FileHandle, chunk: Uint8Array): Promise<void> {
  let done = 0;
  while (done < chunk.length) {
    const { bytesWritten } = await fh.write(chunk, done, chunk.length - done);
    done += bytesWritten;
  }
}

export class BlobStore {
  readonly dir: string;

  constructor(home: string = torporHome()) {
    this.dir = blobDir(home);
  }

  path(digest: string): string {
    return join(this.dir, digestHex(digest));
  }

  private swept = false;

  /**
   * Once per store object: removes the private copies (tmp.<pid>.*) a killed process left. A
   * dead process's partial download (<hex>.partial.<pid>.*) is not removed here: the next
   * download of that blob takes it over.
   */
  private async sweep(): Promise<void> {
    if (this.swept) return;
    this.swept = true;
    for (const name of await readdir(this.dir).catch(() => [] as string[])) {
      const m = /^tmp\.(\d+)\.[a-f0-9]+$/.exec(name);
      if (m && Number(m[1]) !== process.pid && !processAlive(Number(m[1]))) await rm(join(this.dir, name), { force: true });
    }
  }

  private tempName(prefix: string): string {
    return join(this.dir, `${prefix}.${process.pid}.${randomHex(6)}`);
  }

  /**
   * Whether the blob is stored: its size must match (a blob cut short by a crash or a full disk
   * never passes for cached); with `verify`, its sha256 too. A damaged one is removed.
   */
  async has(digest: string, size: number, verify = false): Promise<boolean> {
    const path = this.path(digest);
    const st = await stat(path).catch(() => null);
    if (!st) return false;
    let ok = st.isFile() && st.size === size;
    if (ok && verify) {
      const hash = createHash('sha256');
      await hashFile(path, hash);
      ok = `sha256:${hash.digest('hex')}` === digest;
    }
    if (!ok) await rm(path, { force: true });
    return ok;
  }

  /** Finishes a temporary file whose hash and size are known good: fsync, read-only, rename into place. */
  private async commit(temp: string, digest: string): Promise<string> {
    const final = this.path(digest);
    await fsyncPath(temp);
    await chmod(temp, 0o444);
    await rename(temp, final);
    await fsyncPath(this.dir);
    return final;
  }

  /** Stores bytes already in memory (manifests, configs) after checking them against `digest`. */
  async putBytes(digest: string, bytes: Buffer, image: string): Promise<string> {
    const actual = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
    if (actual !== digest) throw new TorporError('BLOB_CORRUPT', `blob ${digest} of ${image} is corrupt: its content hashes to ${actual}`);
    if (await this.has(digest, bytes.length)) return this.path(digest);
    await mkdir(this.dir, { recursive: true });
    await this.sweep();
    const temp = this.tempName('tmp');
    try {
      const fh = await open(temp, 'wx', 0o644);
      try {
        await writeAll(fh, bytes);
      } finally {
        await fh.close();
      }
      return await this.commit(temp, digest);
    } catch (err) {
      await rm(temp, { force: true });
      throw err;
    }
  }

  /**
   * Copies a stream into the store while hashing it. With `expect.digest` (and size) the bytes
   * must match, else BLOB_CORRUPT; without, the digest is computed (docker save's layers carry
   * none). Returns where it is and what it hashed to.
   */
  async importStream(
    source: AsyncIterable<Uint8Array>,
    expect: { digest?: string; size?: number },
    image: string,
  ): Promise<{ digest: string; size: number; path: string }> {
    await mkdir(this.dir, { recursive: true });
    await this.sweep();
    const temp = this.tempName('tmp');
    const hash = createHash('sha256');
    let size = 0;
    try {
      const fh = await open(temp, 'wx', 0o644);
      try {
        for await (const chunk of source) {
          hash.update(chunk);
          size += chunk.length;
          await writeAll(fh, chunk);
        }
      } finally {
        await fh.close();
      }
      const digest = `sha256:${hash.digest('hex')}`;
      if (expect.digest !== undefined && digest !== expect.digest) {
        throw new TorporError('BLOB_CORRUPT', `blob ${expect.digest} of ${image} is corrupt: its content hashes to ${digest}`);
      }
      if (expect.size !== undefined && size !== expect.size) {
        throw new TorporError('BLOB_CORRUPT', `blob ${digest} of ${image} is corrupt: ${size} bytes where ${expect.size} were expected`);
      }
      if (await this.has(digest, size)) {
        await rm(temp, { force: true });
        return { digest, size, path: this.path(digest) };
      }
      return { digest, size, path: await this.commit(temp, digest) };
    } catch (err) {
      await rm(temp, { force: true });
      throw err;
    }
  }

  /**
   * Takes over an interrupted download of `hex` if there is one: the shared <hex>.partial, or
   * the private name of a process that died mid-download. Returns the private name now holding
   * it (possibly empty and new).
   */
  private async claimPartial(hex: string): Promise<string> {
    const mine = this.tempName(`${hex}.partial`);
    const candidates = [join(this.dir, `${hex}.partial`)];
    for (const name of await readdir(this.dir)) {
      const m = /^([a-f0-9]{64})\.partial\.(\d+)\.[a-f0-9]+$/.exec(name);
      if (m && m[1] === hex && Number(m[2]) !== process.pid && !processAlive(Number(m[2]))) candidates.push(join(this.dir, name));
    }
    for (const candidate of candidates) {
      try {
        await rename(candidate, mine);
        return mine;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
    }
    await (await open(mine, 'wx', 0o644)).close();
    return mine;
  }

  /** Downloads a blob (or finds it cached), resuming an interrupted download of it. */
  async download(d: BlobDownload): Promise<{ path: string; cached: boolean }> {
    const { digest, size, image } = d;
    const hex = digestHex(digest);
    if (await this.has(digest, size, d.verify)) {
      d.onProgress?.({ phase: 'download', digest, bytes: size, total: size, cached: true });
      return { path: this.path(digest), cached: true };
    }
    await mkdir(this.dir, { recursive: true });
    const mine = await this.claimPartial(hex);
    try {
      await this.fill(mine, d);
      return { path: await this.commit(mine, digest), cached: false };
    } catch (err) {
      // Bytes that failed their check go; a prefix left by a broken transfer (or an unreachable
      // registry) stays for the next attempt to resume.
      const damaged = err instanceof TorporError && err.code === 'BLOB_CORRUPT';
      if (!damaged && (await stat(mine).catch(() => null))?.size) {
        // Hand the bytes back under the shared name for whoever resumes (a blob finished by
        // someone else meanwhile makes them worthless).
        if (await this.has(digest, size)) await rm(mine, { force: true });
        else await rename(mine, join(this.dir, `${hex}.partial`)).catch(() => rm(mine, { force: true }));
      } else {
        await rm(mine, { force: true });
      }
      if (err instanceof TransferInterrupted) throw err.cause;
      throw err;
    }
  }

  /** Brings `file` (a prefix of the blob, maybe empty) to the whole blob and checks it. */
  private async fill(file: string, d: BlobDownload): Promise<void> {
    const { digest, size, image } = d;
    let hash = createHash('sha256');
    let offset = await hashFile(file, hash);
    if (offset === size && `sha256:${hash.copy().digest('hex')}` === digest) return; // finished, not yet renamed
    if (offset >= size) {
      hash = createHash('sha256');
      offset = 0;
    }
    const fh = await open(file, 'r+');
    try {
      await fh.truncate(offset);
      let res = await d.open(offset);
      if (offset > 0 && res.status !== 206) {
        // The server ignored the range (200) or refused it (416): start over from byte 0.
        if (res.status !== 200) {
          await res.body?.cancel();
          res = await d.open(0);
        }
        hash = createHash('sha256');
        offset = 0;
        await fh.truncate(0);
      } else if (offset > 0) {
        const range = /^bytes (\d+)-/.exec(res.headers.get('content-range') ?? '');
        if (!range || Number(range[1]) !== offset) {
          await res.body?.cancel();
          throw corrupt(digest, image, `the registry answered a range request for byte ${offset} on with ${res.headers.get('content-range') ?? 'no Content-Range'}`);
        }
      }
      if (!res.body) throw corrupt(digest, image, 'the registry sent no body');
      let bytes = offset;
      let lastReport = 0;
      d.onProgress?.({ phase: 'download', digest, bytes, total: size, cached: false });
      try {
        for await (const chunk of res.body) {
          if (bytes + chunk.length > size) {
            await res.body.cancel().catch(() => {});
            throw corrupt(digest, image, `the registry sent more than the manifest's ${size} bytes`);
          }
          hash.update(chunk);
          await fh.write(chunk, 0, chunk.length, bytes);
          bytes += chunk.length;
          const now = performance.now();
          if (now - lastReport >= 100) {
            lastReport = now;
            d.onProgress?.({ phase: 'download', digest, bytes, total: size, cached: false });
          }
        }
      } catch (err) {
        if (err instanceof TorporError) throw err;
        throw new TransferInterrupted('interrupted', {
          cause:
            d.signal?.aborted
              ? d.signal.reason
              : new TorporError('REGISTRY_UNREACHABLE', `downloading blob ${digest} of ${image} broke off after ${bytes} of ${size} bytes: ${(err as Error).message}; a retry resumes it`, { cause: err }),
        });
      }
      if (bytes !== size) throw corrupt(digest, image, `the download ended after ${bytes} of ${size} bytes`);
      const actual = `sha256:${hash.digest('hex')}`;
      if (actual !== digest) throw corrupt(digest, image, `its content hashes to ${actual}`);
      d.onProgress?.({ phase: 'download', digest, bytes, total: size, cached: false });
    } finally {
      await fh.close();
    }
  }
}
