// The checkout compiled to JavaScript for the nested host. In L1 every Node start through tsx
// pays for its module hooks, which Node runs on a thread of their own, under QEMU's emulator;
// the child processes the suite's files start (a sandbox connected from another process, a
// restore in a child, the CLI) run from this build instead, as the published package runs dist/.
//
// tsc (tsconfig.json, emitting) writes lib/, test/, bench/, examples/ and scripts/ into a
// directory of this run inside the checkout; their other files (.mjs, data) and every other
// top-level entry of the checkout (package.json, build/, guest/, deps/, node_modules/...) are
// linked in. Modules that find the package root relative to their own file (lib/native.ts,
// lib/setup/paths.ts) then find this directory, and through its links the checkout's files.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, symlinkSync } from 'node:fs';
import { join, relative } from 'node:path';

/** The directories tsc compiles (tsconfig.json's include). */
const COMPILED = ['lib', 'test', 'bench', 'examples', 'scripts'];

/** Links every file under `from` that tsc did not compile (not a .ts file) to the same place under `to`. */
function linkUncompiled(from: string, to: string): void {
  for (const e of readdirSync(from, { withFileTypes: true })) {
    const src = join(from, e.name);
    const dst = join(to, e.name);
    if (e.isDirectory()) {
      mkdirSync(dst, { recursive: true });
      linkUncompiled(src, dst);
    } else if (!e.name.endsWith('.ts') && !existsSync(dst)) {
      symlinkSync(relative(to, src), dst);
    }
  }
}

/**
 * Compiles `checkout` into a new directory `.nested-build-*` inside it and returns its path, or
 * throws with tsc's status. The caller removes it when its run ends.
 */
export function compileCheckout(checkout: string): string {
  const dir = mkdtempSync(join(checkout, '.nested-build-'));
  const tsc = spawnSync(
    process.execPath,
    [join(checkout, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(checkout, 'tsconfig.json'), '--noEmit', 'false', '--rootDir', checkout, '--outDir', dir, '--declaration', 'false', '--sourceMap', 'false'],
    { stdio: 'inherit' },
  );
  if (tsc.status !== 0) throw new Error(`tsc -p tsconfig.json --outDir ${dir} failed (status ${tsc.status})`);
  for (const e of readdirSync(checkout, { withFileTypes: true })) {
    if (e.name === '.git' || e.name.startsWith('.nested-')) continue;
    if (COMPILED.includes(e.name) && e.isDirectory()) linkUncompiled(join(checkout, e.name), join(dir, e.name));
    else symlinkSync(join('..', e.name), join(dir, e.name));
  }
  return dir;
}
