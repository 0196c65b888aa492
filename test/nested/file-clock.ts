// Which test file uvu is running and for how long, read from its output as it arrives: uvu
// prints a file's name when the file starts and "(passed / total)" when it ends. The nested
// suite uses it to stop a file that hangs (instead of letting L1's overall timeout end the
// run with no word of where it stood) and to print what each file took.

const ANSI = /\x1b\[[0-9;]*m/g;

export interface FileTime {
  name: string;
  seconds: number;
}

export class FileClock {
  /** The file running now, and since when (ms, the caller's clock). */
  current: string | undefined;
  since = 0;
  readonly done: FileTime[] = [];
  #partial = '';

  /** Feeds a chunk of uvu's stdout, read at time `now` (ms). */
  feed(chunk: string, now: number): void {
    const lines = (this.#partial + chunk).split('\n');
    this.#partial = lines.pop()!;
    for (const raw of lines) {
      const line = raw.replace(ANSI, '');
      const name = /^(\S+)\.test\.ts\s*$/.exec(line);
      if (name) {
        this.current = name[1];
        this.since = now;
      } else if (this.current && /\(\d+ \/ \d+\)\s*$/.test(line)) {
        this.done.push({ name: this.current, seconds: (now - this.since) / 1000 });
        this.current = undefined;
      }
    }
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
