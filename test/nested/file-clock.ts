// Which test file uvu is running and for how long, read from its output as it arrives: uvu
// prints a file's name when the file starts, a mark per test as it ends (✘ for a failure) and
// "(passed / total)" when the file ends. The nested suite uses it to stop a file that hangs
// (instead of letting L1's overall timeout end the run with no word of where it stood), to
// print what each file took, and to keep what finished across a wedge (suite-state.ts).

const ANSI = /\x1b\[[0-9;]*m/g;

export interface FileTime {
  name: string;
  seconds: number;
  passed: number;
  total: number;
}

/** uvu's mark for a failed test. */
const FAILED_MARK = '✘';

export class FileClock {
  /** The file running now, and since when (ms, the caller's clock). */
  current: string | undefined;
  since = 0;
  /** Whether a test of the current file has failed so far. */
  currentFailed = false;
  readonly done: FileTime[] = [];
  #partial = '';

  /** Feeds a chunk of uvu's stdout, read at time `now` (ms). */
  feed(chunk: string, now: number): void {
    const lines = (this.#partial + chunk).split('\n');
    this.#partial = lines.pop()!;
    for (const raw of lines) {
      const line = raw.replace(ANSI, '');
      const name = /^(\S+)\.test\.ts\s*$/.exec(line);
      const counts = /\((\d+) \/ (\d+)\)\s*$/.exec(line);
      if (name) {
        this.current = name[1];
        this.since = now;
        this.currentFailed = false;
      } else if (this.current && counts) {
        this.done.push({ name: this.current, seconds: (now - this.since) / 1000, passed: Number(counts[1]), total: Number(counts[2]) });
        this.current = undefined;
        this.currentFailed = false;
      } else if (this.current && line.includes(FAILED_MARK)) {
        this.currentFailed = true;
      }
    }
    // The marks of a file still running sit on a line not ended yet.
    if (this.current && this.#partial.includes(FAILED_MARK)) this.currentFailed = true;
  }

  /** Seconds the current file has run at `now`, or 0 between files. */
  runningFor(now: number): number {
    return this.current ? (now - this.since) / 1000 : 0;
  }

  /** The files that took longest, "name 123 s" each, longest first. */
  slowest(n: number): string {
    return [...this.done]
      .sort((a, b) => b.seconds - a.seconds)
      .slice(0, n)
      .map((f) => `${f.name} ${f.seconds.toFixed(0)} s`)
      .join(', ');
  }
}
