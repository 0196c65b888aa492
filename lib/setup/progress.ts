// Progress of `torpor setup`, per phase: a live status line on a terminal,
// plain timestamped lines otherwise (CI logs, pipes).

/** A phase of setup: building or fetching the guest agent, the kernel, or the root filesystem. */
export type PhaseName = 'agent' | 'kernel' | 'rootfs';

/** One progress report of {@link ensureArtifacts}. */
export interface ProgressEvent {
  /** The phase it is about. */
  phase: PhaseName;
  /** start: work begins; step: an update; done: built; cached: nothing to do; note: a message to keep. */
  status: 'start' | 'step' | 'done' | 'cached' | 'note';
  /** 0..100 when the phase can estimate it. */
  percent?: number;
  /** Bytes produced so far, when that is the natural measure. */
  bytes?: number;
  /** Short description of the current step. */
  message?: string;
  /** Milliseconds since the phase started. */
  elapsedMs: number;
}

/** Where {@link ensureArtifacts} sends its progress. */
export type ProgressSink = (event: ProgressEvent) => void;

/** 1536 -> "1.5 KiB": binary units, one decimal. */
export function formatBytes(n: number): string {
  if (n >= 1 << 30) return `${(n / (1 << 30)).toFixed(1)} GiB`;
  if (n >= 1 << 20) return `${(n / (1 << 20)).toFixed(1)} MiB`;
  if (n >= 1 << 10) return `${(n / (1 << 10)).toFixed(1)} KiB`;
  return `${n} B`;
}

export function formatEvent(e: ProgressEvent): string {
  const parts: string[] = [`${e.phase}:`];
  if (e.status === 'cached') parts.push('up to date');
  else if (e.status === 'done') parts.push('done');
  else if (e.status === 'start') parts.push('starting');
  if (e.percent !== undefined) parts.push(`${Math.floor(e.percent)}%`);
  if (e.bytes !== undefined) parts.push(formatBytes(e.bytes));
  if (e.message) parts.push(e.message);
  parts.push(`(${(e.elapsedMs / 1000).toFixed(1)} s)`);
  return parts.join(' ');
}

/**
 * A sink writing to a stream. On a TTY, steps overwrite one status line
 * (throttled); elsewhere a step is printed when its message changes, or at
 * most every `plainIntervalMs` per phase, so a CI log shows progress without
 * thousands of lines.
 */
export function streamProgress(stream: NodeJS.WriteStream, plainIntervalMs = 10_000): ProgressSink {
  const tty = stream.isTTY === true;
  let lastLive = 0;
  let liveLine = false;
  const lastPlain = new Map<PhaseName, { at: number; message: string | undefined }>();
  return (e) => {
    const line = formatEvent(e);
    const now = Date.now();
    if (e.status === 'step') {
      if (tty) {
        if (now - lastLive < 100) return;
        lastLive = now;
        const width = Math.max(20, (stream.columns ?? 80) - 1);
        stream.write(`\r\x1b[K${line.slice(0, width)}`);
        liveLine = true;
      } else {
        const last = lastPlain.get(e.phase);
        if (last && last.message === e.message && now - last.at < plainIntervalMs) return;
        lastPlain.set(e.phase, { at: now, message: e.message });
        stream.write(line + '\n');
      }
      return;
    }
    if (tty && liveLine) stream.write('\r\x1b[K');
    liveLine = false;
    stream.write(line + '\n');
  };
}
