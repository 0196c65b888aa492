// The agent phase: the guest agent (guest/agent, built by its own Makefile) as
// a store artifact keyed by the binary's hash. The rootfs key includes that
// hash, so a changed agent yields a new image.
import { chmod, copyFile, mkdir } from 'node:fs/promises';
import { join } from 'node:path';

import { TorporError } from '../errors.js';
import { ensureArtifact, type ArtifactResult } from '../store/artifact.js';
import { sha256File } from '../store/hash.js';
import { acquireLock } from '../store/lock.js';
import { agentDir } from './paths.js';
import type { ProgressSink } from './progress.js';
import { runScript } from './run-script.js';

export interface AgentArtifact {
  path: string;
  sha256: string;
  artifact: ArtifactResult;
}

/** Where `make -C guest/agent` puts the static guest binary. */
export const AGENT_MAKE_OUTPUT = join(agentDir, 'out', 'torpor-agent-static');

/** A prebuilt agent, and (from the kernel package's release record) the hash it must have. */
export interface PrebuiltAgent {
  path: string;
  /** The copy stored must have this hash; otherwise `refuse` is thrown and nothing is stored. */
  expect?: { sha256: string; refuse: (got: string) => TorporError };
}

/** Hashes `source` and stores a copy of it as the agent artifact. */
async function storeAgent(prebuilt: PrebuiltAgent, root: string, verify: boolean, onProgress?: ProgressSink): Promise<AgentArtifact> {
  const source = prebuilt.path;
  let hash: string;
  try {
    hash = await sha256File(source);
  } catch (err) {
    throw new TorporError('SETUP_FAILED', `the guest agent binary ${source} is missing: ${(err as Error).message}`, { cause: err });
  }
  if (prebuilt.expect && hash !== prebuilt.expect.sha256) throw prebuilt.expect.refuse(hash);
  const artifact = await ensureArtifact(
    {
      kind: 'agent',
      inputs: { binary: hash },
      files: ['torpor-agent'],
      build: async (dir) => {
        onProgress?.({ phase: 'agent', status: 'start', message: source, elapsedMs: 0 });
        const dest = join(dir, 'torpor-agent');
        await copyFile(source, dest);
        await chmod(dest, 0o755);
        if ((await sha256File(dest)) !== hash) {
          throw new TorporError('SETUP_FAILED', `${source} changed while it was being copied; run setup again`);
        }
      },
    },
    { root, verify },
  );
  return { path: join(artifact.dir, 'torpor-agent'), sha256: hash, artifact };
}

/**
 * Brings the agent up to date (make is incremental: a no-op costs milliseconds)
 * unless `prebuilt` names a binary to use (TORPOR_AGENT, the kernel package's), then stores a copy.
 */
export async function ensureAgent(root: string, verify: boolean, prebuilt?: string | PrebuiltAgent, onProgress?: ProgressSink): Promise<AgentArtifact> {
  if (prebuilt) return storeAgent(typeof prebuilt === 'string' ? { path: prebuilt } : prebuilt, root, verify, onProgress);
  // Two torpor processes running make at once could each hash a binary the
  // other is still writing: make, hash and copy under one lock (kept in the store).
  await mkdir(root, { recursive: true });
  const lock = await acquireLock(join(root, 'agent-make.lock'));
  try {
    await runScript('make', ['-s', '-C', agentDir, 'out/torpor-agent-static'], {
      what: 'building the guest agent (make -C guest/agent)',
    });
    return await storeAgent({ path: AGENT_MAKE_OUTPUT }, root, verify, onProgress);
  } finally {
    await lock.release();
  }
}
