// Durable writes: fsync of a file or a directory (a directory after a rename in it, so the rename
// is durable), and a small file replaced whole (meta.json, a snapshot directory's `current`).
import { open } from 'node:fs/promises';

import { loadNative } from '../native.js';
import { randomHex } from '../random.js';

export async function fsyncPath(path: string, flags = 'r'): Promise<void> {
  const fh = await open(path, flags);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** A temporary file's name beside `path`, its own (pid and random suffix: two writes at once in
 *  one process never share one), `<name>.<pid>.<hex>.tmp`: what a sweep of a dead process's
 *  temporaries looks for (SandboxDir.dropStaleMetaTemps). */
export function tempBeside(path: string): string {
  return `${path}.${process.pid}.${randomHex(3)}.tmp`;
}

/**
 * Replaces `path` with `text` so that a crash leaves the old file or the new one: written to
 * a temporary beside it (tempBeside), fsynced, renamed over `path`, the directory fsynced. One round on
 * the thread pool (the addon does every step in one work item), where node:fs takes eight (open,
 * write, fsync, close, rename; open, fsync, close of the directory), each a callback on the JS
 * thread: a fork's ten children write their meta.json at once. A failure (PERMISSION_DENIED,
 * OUT_OF_SPACE, IO_ERROR, with errno) before the rename leaves `path` as it was and no temporary;
 * one after it (the directory's fsync) leaves the new file in place, not known to be durable.
 */
export function replaceFileDurably(path: string, text: string): Promise<void> {
  return loadNative().replaceFileDurably(tempBeside(path), path, text);
}
