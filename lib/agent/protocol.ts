// Constants of the agent protocol, version 1 (docs/protocol.md is the source of truth).

export const PROTOCOL_VERSION = 1;

/** Bytes of a frame header: length u32, stream u32, type u16, flags u16. */
export const FRAME_HEADER_BYTES = 12;
/** Largest payload either side accepts; a larger length closes the connection. */
export const MAX_PAYLOAD_BYTES = 1024 * 1024;
/** An EXEC request may be larger (its argv and env, about 2 MiB in all as Linux allows), to an
 *  agent that announced the `users` feature. */
export const MAX_EXEC_PAYLOAD_BYTES = 2560 * 1024;
/** The largest payload of a frame of this type. */
export function maxPayloadFor(type: number): number {
  return type === FrameType.EXEC ? MAX_EXEC_PAYLOAD_BYTES : MAX_PAYLOAD_BYTES;
}
/** Largest `data` field in one frame. */
export const MAX_DATA_BYTES = MAX_PAYLOAD_BYTES - 64;
/** Bytes of a field header: tag u16, len u32. */
export const FIELD_HEADER_BYTES = 6;
/** Window each side starts every stream with, per direction. */
export const INITIAL_WINDOW = 262144;

export const FLAG_END = 1;
export const FLAG_ERROR = 2;
export const KNOWN_FLAGS = FLAG_END | FLAG_ERROR;

export const FrameType = {
  HELLO: 1,
  PING: 2,
  PONG: 3,
  CREDIT: 4,
  CANCEL: 5,
  GOAWAY: 6,
  EXEC: 16,
  ATTACH: 17,
  STDIN: 18,
  PROC_SIGNAL: 19,
  PROC_LIST: 20,
  PTY_RESIZE: 21,
  FILE_READ: 32,
  FILE_WRITE: 33,
  FILE_LIST: 34,
  FILE_STAT: 35,
  MKDIR: 36,
  REMOVE: 37,
  RENAME: 38,
  WATCH: 39,
  SYNC: 48,
  POWEROFF: 49,
  RESUMED: 50,
  ECHO: 51,
  GROW_FS: 52,
  OK: 64,
  STARTED: 65,
  STDOUT: 66,
  STDERR: 67,
  EXITED: 68,
  DATA: 69,
  ERR: 70,
  EVENT: 71,
} as const;
export type FrameTypeName = keyof typeof FrameType;

export const Tag = {
  version: 1,
  features: 2,
  name: 3,
  nonce: 4,
  request_id: 5,
  credit: 6,
  code: 7,
  errno: 8,
  message: 9,
  path: 10,
  path2: 11,
  arg: 12,
  shell: 13,
  env: 14,
  uid: 15,
  gid: 16,
  user: 17,
  timeout_ms: 18,
  pty_rows: 19,
  pty_cols: 20,
  tag: 21,
  pid: 22,
  signal: 23,
  exit_code: 24,
  offset: 25,
  offset2: 26,
  data: 27,
  mode: 28,
  depth: 29,
  recursive: 30,
  entry: 31,
  type: 32,
  size: 33,
  mtime_ns: 34,
  target: 35,
  running: 36,
  time_ns: 37,
  entropy: 38,
  reboot: 39,
  stdin: 40,
  timed_out: 41,
  uid_out: 42,
  pending: 43,
  stdout_start: 44,
  stderr_start: 45,
  gid_out: 46,
  owner: 47,
  group: 48,
  follow: 49,
  event: 50,
  seq: 51,
  watch_id: 52,
  dropped: 53,
  fs_size: 54,
  hostname: 55,
  machine_id: 56,
  mac: 57,
} as const;
export type TagName = keyof typeof Tag;

export type FieldKind = 'u32' | 'u64' | 'i32' | 'i64' | 'bool' | 'str' | 'bytes';

const STR_MAX = 64 * 1024;
/** An exec string (argv element, shell string, env entry): Linux's MAX_ARG_STRLEN, 128 KiB with
 *  its terminating NUL. */
export const ARG_MAX_BYTES = 128 * 1024 - 1;
const PATH_MAX = 4096;

/** Kind and size bound of every known tag: decoding checks them, so a peer cannot hand us a
 *  4 GiB "name" or an 8-byte bool. Unknown tags are skipped (forward compatibility). */
export const FIELD_SPEC: Record<number, { kind: FieldKind; max?: number }> = {
  [Tag.version]: { kind: 'u32' },
  [Tag.features]: { kind: 'u64' },
  [Tag.name]: { kind: 'str', max: STR_MAX },
  [Tag.nonce]: { kind: 'bytes', max: 64 },
  [Tag.request_id]: { kind: 'u64' },
  [Tag.credit]: { kind: 'u32' },
  [Tag.code]: { kind: 'str', max: STR_MAX },
  [Tag.errno]: { kind: 'str', max: STR_MAX },
  [Tag.message]: { kind: 'str', max: STR_MAX },
  [Tag.path]: { kind: 'str', max: PATH_MAX },
  [Tag.path2]: { kind: 'str', max: PATH_MAX },
  [Tag.arg]: { kind: 'str', max: ARG_MAX_BYTES },
  [Tag.shell]: { kind: 'str', max: ARG_MAX_BYTES },
  [Tag.env]: { kind: 'str', max: ARG_MAX_BYTES },
  [Tag.uid]: { kind: 'u32' },
  [Tag.gid]: { kind: 'u32' },
  [Tag.user]: { kind: 'str', max: STR_MAX },
  [Tag.timeout_ms]: { kind: 'u32' },
  [Tag.pty_rows]: { kind: 'u32' },
  [Tag.pty_cols]: { kind: 'u32' },
  [Tag.tag]: { kind: 'str', max: 256 },
  [Tag.pid]: { kind: 'u32' },
  [Tag.signal]: { kind: 'u32' },
  [Tag.exit_code]: { kind: 'i32' },
  [Tag.offset]: { kind: 'u64' },
  [Tag.offset2]: { kind: 'u64' },
  [Tag.data]: { kind: 'bytes', max: MAX_DATA_BYTES },
  [Tag.mode]: { kind: 'u32' },
  [Tag.depth]: { kind: 'u32' },
  [Tag.recursive]: { kind: 'bool' },
  [Tag.entry]: { kind: 'bytes', max: MAX_PAYLOAD_BYTES },
  [Tag.type]: { kind: 'str', max: STR_MAX },
  [Tag.size]: { kind: 'u64' },
  [Tag.mtime_ns]: { kind: 'i64' },
  [Tag.target]: { kind: 'str', max: PATH_MAX },
  [Tag.running]: { kind: 'bool' },
  [Tag.time_ns]: { kind: 'i64' },
  [Tag.entropy]: { kind: 'bytes', max: 512 },
  [Tag.reboot]: { kind: 'bool' },
  [Tag.stdin]: { kind: 'bool' },
  [Tag.timed_out]: { kind: 'bool' },
  [Tag.uid_out]: { kind: 'u32' },
  [Tag.pending]: { kind: 'bool' },
  [Tag.stdout_start]: { kind: 'u64' },
  [Tag.stderr_start]: { kind: 'u64' },
  [Tag.gid_out]: { kind: 'u32' },
  [Tag.owner]: { kind: 'str', max: STR_MAX },
  [Tag.group]: { kind: 'str', max: STR_MAX },
  [Tag.follow]: { kind: 'bool' },
  [Tag.event]: { kind: 'str', max: STR_MAX },
  [Tag.seq]: { kind: 'u64' },
  [Tag.watch_id]: { kind: 'u32' },
  [Tag.dropped]: { kind: 'u64' },
  [Tag.fs_size]: { kind: 'u64' },
  [Tag.hostname]: { kind: 'str', max: 63 },
  [Tag.machine_id]: { kind: 'str', max: 32 },
  [Tag.mac]: { kind: 'bytes', max: 6 },
};

/** Feature bits of HELLO. */
export const Feature = {
  exec: 1n << 0n,
  pty: 1n << 1n,
  files: 1n << 2n,
  attach: 1n << 3n,
  resumed: 1n << 4n,
  request_ids: 1n << 5n,
  /** Default user, `user` on file requests, owner/group names, FILE_STAT `follow`, 128 KiB exec strings. */
  users: 1n << 6n,
  /** WATCH / EVENT (files.watchDir). */
  watch: 1n << 7n,
  /** GROW_FS: the root filesystem grown online to fill a disk grown on restore. */
  grow_fs: 1n << 8n,
  /** RESUMED's hostname, machine_id and mac: the sandbox's own identity in the guest. */
  identity: 1n << 9n,
} as const;
export const CLIENT_FEATURES =
  Feature.exec | Feature.pty | Feature.files | Feature.attach | Feature.resumed | Feature.request_ids | Feature.users | Feature.watch | Feature.grow_fs | Feature.identity;

/** Frame types that carry flow-controlled `data`. */
export function isDataFrame(type: number): boolean {
  return type === FrameType.STDOUT || type === FrameType.STDERR || type === FrameType.DATA || type === FrameType.STDIN;
}
