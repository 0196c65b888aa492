// Where torpor keeps everything it builds and every sandbox it owns (docs/architecture.md#on-disk-layout).
import { homedir } from 'node:os';
import { join, resolve } from 'node:path';

/** $TORPOR_HOME, else $XDG_DATA_HOME/torpor, else ~/.local/share/torpor. */
export function torporHome(env: NodeJS.ProcessEnv = process.env): string {
  if (env.TORPOR_HOME) return resolve(env.TORPOR_HOME);
  if (env.XDG_DATA_HOME) return resolve(env.XDG_DATA_HOME, 'torpor');
  return join(homedir(), '.local', 'share', 'torpor');
}

/** The fixed layout under a torpor home. */
export interface HomeLayout {
  root: string;
  /** artifacts/<kind>/<key>/: kernels, root filesystems, agents, keyed by their inputs. */
  artifacts: string;
  /** templates/<name>/ */
  templates: string;
  /** sandboxes/<id>/ */
  sandboxes: string;
  /** setup.json: choices `torpor setup` remembers (a user-supplied kernel). */
  setupRecord: string;
}

export function homeLayout(root: string = torporHome()): HomeLayout {
  return {
    root,
    artifacts: join(root, 'artifacts'),
    templates: join(root, 'templates'),
    sandboxes: join(root, 'sandboxes'),
    setupRecord: join(root, 'setup.json'),
  };
}
