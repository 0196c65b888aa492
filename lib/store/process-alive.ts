// Whether a process a lock file or a temporary name recorded is still there.

/** Whether process `pid` exists (ours or another user's: EPERM says it does). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}
