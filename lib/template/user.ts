// An image's `User` ('' | name | uid | name:group | uid:gid) as the agent's request fields.
// Commands take a name or numbers; file requests take a name only, so a numeric user acts
// through the agent's own identity there (root) and files it writes are root's.
import type { CommandDefaults } from '../sandbox/commands.js';

export function parseImageUser(user: string): Pick<CommandDefaults, 'user' | 'uid' | 'gid'> {
  if (user === '') return { uid: 0, gid: 0 };
  const [u, g] = user.split(':', 2) as [string, string | undefined];
  const gid = g !== undefined && /^\d+$/.test(g) ? { gid: Number(g) } : {};
  if (/^\d+$/.test(u)) return { uid: Number(u), ...gid };
  return { user: u };
}

/** Request options for `user` ('': none given, the template's default applies). */
export function userRequest(user: string, kind: 'commands' | 'files'): { user?: string; uid?: number; gid?: number } {
  if (user === '') return {};
  const p = parseImageUser(user);
  if (p.user !== undefined) return { user: p.user };
  if (kind === 'files') return p.uid === 0 ? { user: 'root' } : {};
  return { uid: p.uid!, ...(p.gid !== undefined ? { gid: p.gid } : {}) };
}
