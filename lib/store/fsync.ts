// fsync of a file or a directory (a directory after a rename in it, so the rename is durable).
import { open } from 'node:fs/promises';

export async function fsyncPath(path: string, flags = 'r'): Promise<void> {
  const fh = await open(path, flags);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}
