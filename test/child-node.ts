// How a test starts a TypeScript file in a child Node process: through tsx, or in the nested host
// from the checkout's JavaScript build that test/nested/run.ts made on the host
// (TORPOR_TEST_BUILD, test/nested/compiled-checkout.ts): there a start through tsx took tens of
// seconds, for its module hooks on a thread of their own under QEMU's emulator.
import { isAbsolute, join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const checkout = fileURLToPath(new URL('..', import.meta.url));

/** Where the build (TORPOR_TEST_BUILD) has the .ts file `path` of this checkout (absolute, or relative to it) compiled. */
function built(build: string, path: string): string {
  const rel = isAbsolute(path) ? relative(checkout, path) : path;
  return join(build, rel.replace(/\.ts$/, '.js'));
}

/** process.execPath's arguments that run `script` (a .ts file of this checkout: absolute, or relative to it) with `args`. */
export function nodeArgs(script: string, ...args: string[]): string[] {
  const build = process.env.TORPOR_TEST_BUILD;
  return build ? [built(build, script), ...args] : ['--import', 'tsx', script, ...args];
}

/** A module of this checkout (`path` relative to it) as `import` takes it in a child's `-e`
 *  script: the .ts path (through tsx) or the build's .js file. */
export function moduleSpecifier(path: string): string {
  const build = process.env.TORPOR_TEST_BUILD;
  return build ? pathToFileURL(built(build, path)).href : `./${path}`;
}

/** process.execPath's arguments that run the ES module source `script` (its imports from moduleSpecifier). */
export function nodeEvalArgs(script: string): string[] {
  const tsx = process.env.TORPOR_TEST_BUILD ? [] : ['--import', 'tsx'];
  return [...tsx, '--input-type=module', '-e', script];
}
