// The guest artifacts (kernel, root filesystem) a create or a template build starts from, resolved
// once per process and TORPOR_HOME: ensureArtifacts() checks the store, which costs far more than
// the stat() that tells a later call nothing changed.
import { stat } from 'node:fs/promises';

import { homeLayout, torporHome } from '../store/home.js';

/** Concurrent creates (8 sandboxes at once) share one ensureArtifacts() call instead of racing
 *  to check or build the same store entries. */
const inFlight = new Map<string, ReturnType<typeof ensureArtifactsOnce>>();
function ensureArtifactsOnce(kernel: string | undefined) {
  return Promise.all([import('../setup/artifacts.js'), import('../setup/progress.js')]).then(([{ ensureArtifacts }, { streamProgress }]) => {
    // A first create that fetches or builds (a download, an image, minutes without a prebuilt
    // kernel) says so on stderr, as `torpor setup` does; one that finds everything stored
    // prints nothing. TORPOR_SETUP_PROGRESS=0 silences it.
    const sink = process.env.TORPOR_SETUP_PROGRESS === '0' ? undefined : streamProgress(process.stderr);
    const onProgress = sink && ((e: Parameters<typeof sink>[0]) => e.status !== 'cached' && sink(e));
    return ensureArtifacts({ ...(kernel ? { kernel } : {}), ...(onProgress ? { onProgress } : {}) });
  });
}
type Resolved = Awaited<ReturnType<typeof ensureArtifactsOnce>>;

/** What a later create in this process reuses: ensureArtifacts() spends 50-80 ms on store
 *  checks, while a stat of each file it named (and of the caller's kernel and setup's record)
 *  costs well under a millisecond. Any change of identity (inode, size, mtime) asks again. */
const resolved = new Map<string, { artifacts: Resolved; stamps: Array<[string, string]> }>();

async function fileStamp(path: string): Promise<string> {
  try {
    const st = await stat(path);
    return `${st.ino}:${st.size}:${st.mtimeMs}`;
  } catch {
    return 'absent';
  }
}

async function stampsOf(paths: string[]): Promise<Array<[string, string]>> {
  return Promise.all(paths.map(async (path): Promise<[string, string]> => [path, await fileStamp(path)]));
}

export async function sharedArtifacts(kernel: string | undefined): Promise<Resolved> {
  const home = torporHome();
  const supplied = kernel ?? process.env.TORPOR_KERNEL;
  const key = `${home}\0${supplied ?? ''}`;
  const hit = resolved.get(key);
  if (hit) {
    const now = await stampsOf(hit.stamps.map(([path]) => path));
    if (now.every(([, stamp], i) => stamp === hit.stamps[i]![1])) return hit.artifacts;
    resolved.delete(key);
  }
  let pending = inFlight.get(key);
  if (!pending) {
    pending = ensureArtifactsOnce(kernel).finally(() => inFlight.delete(key));
    inFlight.set(key, pending);
  }
  const artifacts = await pending;
  const watched = [artifacts.kernel, artifacts.rootfs, homeLayout(home).setupRecord, ...(supplied ? [supplied] : [])];
  resolved.set(key, { artifacts, stamps: await stampsOf(watched) });
  return artifacts;
}
