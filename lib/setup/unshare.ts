// Whether mmdebstrap's unshare mode can run as this user: what building the Debian base without
// root needs (guest/image/build.sh --tar). Checked before setup starts, so a user hears why
// the base needs root here instead of a failure five minutes in.
import { readFileSync } from 'node:fs';
import { userInfo } from 'node:os';

import { onPath } from './tools.js';

function readOr(path: string, fallback: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return fallback;
  }
}

/** Null when unshare mode can run here; otherwise why not, and what fixes it. */
export function unshareBlocker(env: NodeJS.ProcessEnv = process.env): string | null {
  if (readOr('/proc/sys/kernel/unprivileged_userns_clone', '1').trim() === '0') {
    return 'unprivileged user namespaces are off (sysctl kernel.unprivileged_userns_clone=0)';
  }
  if (readOr('/proc/sys/user/max_user_namespaces', '1').trim() === '0') return 'user namespaces are off (sysctl user.max_user_namespaces=0)';
  if (!onPath('newuidmap', env) || !onPath('newgidmap', env)) return 'newuidmap and newgidmap are missing (apt-get install uidmap)';
  const { username, uid } = userInfo();
  const names = new Set([username, String(uid)]);
  for (const file of ['/etc/subuid', '/etc/subgid']) {
    const has = readOr(file, '')
      .split('\n')
      .some((line) => names.has(line.split(':')[0]!));
    if (!has) return `${file} has no range for ${username} (as root: usermod --add-subuids 100000-165535 --add-subgids 100000-165535 ${username})`;
  }
  return null;
}
