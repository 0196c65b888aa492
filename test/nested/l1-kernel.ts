// The nested test host's L1 kernel: built from guest/kernel/torpor.config plus
// test/nested/l1.config by the guest kernel's own machinery, cached in the
// artifact store as artifacts/kernel-l1/<key>/ (keyed like every artifact, so
// a changed fragment, script or compiler builds a new one).
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { inspectKernel } from '../../lib/setup/kernel-format.js';
import { builtKernelSpec } from '../../lib/setup/kernel.js';
import { streamProgress } from '../../lib/setup/progress.js';
import { ensureArtifact } from '../../lib/store/artifact.js';
import { homeLayout } from '../../lib/store/home.js';

export const L1_FRAGMENT = join(fileURLToPath(new URL('.', import.meta.url)), 'l1.config');

export interface L1Kernel {
  path: string;
  built: boolean;
  buildMs: number;
}

/** The L1 kernel's vmlinux, built (niced: it shares the machine) when not in the store yet. */
export async function ensureL1Kernel(root = homeLayout().artifacts): Promise<L1Kernel> {
  const progress = streamProgress(process.stderr);
  const spec = await builtKernelSpec(progress, {
    kind: 'kernel-l1',
    fragment: L1_FRAGMENT,
    what: "the nested host's L1 kernel",
    wrapper: ['nice', '-n', '10'],
  });
  const artifact = await ensureArtifact(spec, {
    root,
    onWait: (pid) => progress({ phase: 'kernel', status: 'note', message: `waiting for another L1 kernel build (pid ${pid ?? '?'})`, elapsedMs: 0 }),
    onDamaged: (_dir, reason) =>
      progress({ phase: 'kernel', status: 'note', message: `stored L1 kernel is damaged (${reason}); rebuilding`, elapsedMs: 0 }),
  });
  const path = join(artifact.dir, 'vmlinux');
  // QEMU boots the uncompressed vmlinux through its PVH note, like our VMM.
  if (artifact.built && (await inspectKernel(path)).format !== 'elf-pvh') {
    throw new Error(`${path}: the L1 kernel has no PVH note; check CONFIG_PVH in the merged config`);
  }
  return { path, built: artifact.built, buildMs: artifact.manifest.buildMs };
}

// `tsx test/nested/l1-kernel.ts`: build (or find) it and print its path.
if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const k = await ensureL1Kernel();
  console.log(`${k.path} (${k.built ? 'built' : 'cached'}, build took ${(k.buildMs / 1000).toFixed(0)} s)`);
}
