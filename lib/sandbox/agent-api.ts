// The commands / files / pty objects over any AgentClient: a Sandbox builds them over its vsock
// client; tests and benchmarks build the very same objects over the agent running on the host.
import type { AgentClient } from '../agent/client.js';
import { Commands, type CommandDefaults, type CommandHooks } from './commands.js';
import { Files } from './files.js';
import { Pty } from './pty.js';

/** The agent's API as a sandbox offers it: what {@link createAgentApi} builds over any agent client. */
export interface AgentApi {
  /** Runs processes. */
  commands: Commands;
  /** The filesystem. */
  files: Files;
  /** Terminals. */
  pty: Pty;
}

/**
 * The commands / files / pty objects over any agent client (a Sandbox builds the same over its
 * vsock client; tests and benchmarks build them over an agent run on the host).
 *
 * @param client - The client, or a function giving the current one (so the owner may swap it, e.g. after a resume).
 * @param defaults - Settings every command inherits (a command's own options win).
 * @returns The three objects.
 */
export function createAgentApi(client: AgentClient | (() => AgentClient), defaults: CommandDefaults = {}): AgentApi {
  return agentApiWith(client, defaults, {});
}

/** createAgentApi, with what the owner watches of the commands (a Sandbox's pause). */
export function agentApiWith(client: AgentClient | (() => AgentClient), defaults: CommandDefaults, hooks: CommandHooks): AgentApi {
  const get = typeof client === 'function' ? client : () => client;
  const commands = new Commands(get, defaults, hooks);
  return { commands, files: new Files(get), pty: new Pty(get, commands) };
}
