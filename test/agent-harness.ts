// Shared by the agent/api tests: the real agent binary on the host (built if missing).
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';

import type { AgentClient } from '../lib/agent/client.js';
import { hostAgentBinary, plainAgentEnv, startHostAgent, type HostAgent } from '../lib/agent/host.js';
import { createAgentApi, type AgentApi } from '../lib/sandbox/agent-api.js';

export function ensureAgentBuilt(): string {
  const bin = hostAgentBinary();
  if (!existsSync(bin)) execFileSync('make', ['-s', '-C', 'guest/agent'], { stdio: 'inherit' });
  return bin;
}

export interface HostApi extends AgentApi {
  agent: HostAgent;
  client: AgentClient;
  close(): Promise<void>;
}

/** A fresh host agent and the commands/files/pty API over one client connection. */
export async function hostApi(opts: { uid?: number; gid?: number; user?: string } = {}): Promise<HostApi> {
  ensureAgentBuilt();
  const agent = await startHostAgent({ ...opts, env: cleanEnv() });
  const client = await agent.client();
  client.onClose((err) => {
    if (err) console.log(`host agent connection lost: ${err.message}; agent ${JSON.stringify(agent.diagnostics())}`);
  });
  return {
    agent,
    client,
    ...createAgentApi(client),
    close: async () => {
      const d = agent.diagnostics();
      if (d.exit !== null || d.stderr) console.log(`host agent: exit ${d.exit}, stderr: ${d.stderr}`);
      await client.close();
      await agent.stop();
    },
  };
}

/** The host agent's environment in tests (see plainAgentEnv). */
export function cleanEnv(): NodeJS.ProcessEnv {
  return plainAgentEnv();
}

export const isRoot = process.getuid?.() === 0;

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** Polls until `cond` holds (or fails after `timeoutMs`). */
export async function until(cond: () => boolean | Promise<boolean>, timeoutMs = 5000, what = 'condition'): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}
