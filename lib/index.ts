// torpor's public entry point.
export * from './errors.js';
// Sandboxes and the agent API (lib/sandbox, lib/agent).
export { SandboxPaginator } from './sandbox/paginator.js';
export { Sandbox, linuxGuestSupport, type SandboxOpts, type ConnectOpts, type PauseResult, type SandboxInfo, type SandboxState, type ListOpts } from './sandbox/sandbox.js';
export type { Checkpoint } from './sandbox/checkpoints.js';
export { Template, type TemplateInfo, type TemplateBuildOpts, type TemplateBuildProgress, type TemplateStep, type TemplateFrom } from './template/template.js';
export type { Resources, ResourcesOpts } from './template/resources.js';
export type { ImageConfig, ImageProgress } from './image/types.js';
export { IllegalTransitionError } from './sandbox/lifecycle.js';
export type { CreatedFrom, ResumedFrom, OnTimeout } from './store/sandbox-dir.js';
export type { NetworkOptions } from './net/options.js';
export type { ProcessControl } from './sandbox/command-handle.js';
export type { CommandDefaults } from './sandbox/commands.js';
export {
  Commands,
  CommandHandle,
  type CommandResult,
  type CommandStartOpts,
  type CommandConnectOpts,
  type Output,
  type OutputEncoding,
  type OutputOf,
  type ProcessInfo,
} from './sandbox/commands.js';
export { Files, type EntryInfo, type FileType, type FileOpts, type WriteOpts, type WriteInfo, type WriteData, type WriteEntry } from './sandbox/files.js';
export { WatchHandle, FilesystemEventType, type FilesystemEvent, type WatchOpts } from './sandbox/watch.js';
export type { RequestOpts } from './sandbox/validate.js';
export { Pty, type PtyHandle, type PtyCreateOpts, type PtySize } from './sandbox/pty.js';
export { createAgentApi, type AgentApi } from './sandbox/agent-api.js';
export { AgentClient, type AgentClientOptions, type Dial } from './agent/client.js';
export type { AgentHello } from './agent/connection.js';
export { connectHostAgent, startHostAgent, type HostAgent } from './agent/host.js';
export { Machine, type MachineOptions, type MachineDisk, type MachineState, type ExitReason, type MachineStats, type RestoreOptions, type SnapshotOptions } from './vm/machine.js';
export type { NativeMachineState, NativeExitReason, NativeMachineStats, NativeSnapshotResult, NativeVsockStats } from './native-types.js';
// Host probe, guest artifacts and where torpor keeps its files.
export { probeHost, formatProbe, type HostProbe, type HostKind } from './host/probe.js';
export { ensureArtifacts, type EnsureArtifactsOptions, type Artifacts, type SetupReport } from './setup/artifacts.js';
export type { ProgressEvent, ProgressSink, PhaseName } from './setup/progress.js';
export type { KernelFormat } from './setup/kernel-format.js';
export { torporHome } from './store/home.js';
