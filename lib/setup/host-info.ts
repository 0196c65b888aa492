// Facts about the build host that feed artifact keys (package and compiler versions).
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const exec = promisify(execFile);

/** Output of a command, trimmed; `fallback` when it cannot run (the key then says so). */
export async function commandOutput(cmd: string, args: string[], fallback = 'unknown'): Promise<string> {
  try {
    const { stdout } = await exec(cmd, args, { timeout: 10_000 });
    return stdout.trim();
  } catch {
    return fallback;
  }
}

/** Installed version of a Debian package ('not-installed' when absent). */
export function debianVersion(pkg: string): Promise<string> {
  return commandOutput('dpkg-query', ['-W', '-f=${Version}', pkg], 'not-installed');
}
