// Locations inside the torpor package (guest/ build scripts ship with it).
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The package root: lib/setup/ (sources) and dist/setup/ (built) are both two levels down. */
export const packageRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

export const kernelDir = join(packageRoot, 'guest', 'kernel');
export const imageDir = join(packageRoot, 'guest', 'image');
export const agentDir = join(packageRoot, 'guest', 'agent');
