// Loads the native addon with node-gyp-build (prebuilds/ first, then build/).
// TORPOR_ADDON=/path/to/torpor.node points at a binary explicitly.
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { TorporError, createError } from './errors.js';
import type { NativeBinding } from './native-types.js';

export type * from './native-types.js';

const require = createRequire(import.meta.url);
const packageRoot = join(dirname(fileURLToPath(import.meta.url)), '..');

let cached: NativeBinding | undefined;

export function loadNative(): NativeBinding {
  if (cached) return cached;
  const explicit = process.env.TORPOR_ADDON;
  let binding: NativeBinding;
  try {
    if (explicit) {
      binding = require(explicit) as NativeBinding;
    } else {
      const gypBuild = require('node-gyp-build') as (dir: string) => unknown;
      binding = gypBuild(packageRoot) as NativeBinding;
    }
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    const hint = explicit
      ? `TORPOR_ADDON=${explicit} could not be loaded. Point it at a torpor.node built for this Node (N-API 8+), or unset it.`
      : 'No usable prebuilt binary in prebuilds/ and no local build in build/. Build it with ' +
        '`npm run build:native` (needs python3, make and g++), or set TORPOR_ADDON=/path/to/torpor.node.';
    throw new TorporError('ADDON_LOAD_FAILED', `torpor's native addon failed to load: ${reason}\n${hint}`, {
      cause: err,
    });
  }
  binding.setErrorFactory(createError);
  cached = binding;
  return binding;
}
