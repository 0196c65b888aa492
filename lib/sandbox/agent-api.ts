// The commands / files / pty objects over any AgentClient: a Sandbox builds them over its vsock
// client; tests and benchmarks build the very same objects over the agent running on the host.
import type { AgentClient } from '../agent/client.js';
import { Commands, type CommandDefaults, type CommandHooks } from './commands.js';
import { Files } from './files.js';
import { Pty } from './pty.js';

export interface AgentApi {
  commands: Commands;
  files: Files;
  pty: Pty;
}

/** `client` is a function so the owner may swap the client (e.g. after a resume) underneath. */
export function createAgentApi(client: AgentClient | (() => AgentClient), defaults: CommandDefaults = {}): AgentApi {
  return agentApiWith(client, defaults, {});
}

/** createAgentApi, with what the owner watches of the commands (a Sandbox's pause). */
export function agentApiWith(client: AgentClient | (() => AgentClient), defaults: CommandDefaults, hooks: CommandHooks): AgentApi {
  const get = typeof client === 'function' ? client : () => client;
  const commands = new Commands(get, defaults, hooks);
  return { commands, files: new Files(get), pty: new Pty(get, commands) };
}
