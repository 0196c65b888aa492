// How a test starts a TypeScript file in a child Node process: through tsx, or in the nested host
// from the checkout's JavaScript build that test/nested/run.ts made on the host
// (TORPOR_TEST_BUILD, test/nested/compiled-checkout.ts): there a start through tsx took tens of
// seconds, for its module hooks on a thread of their own under QEMU's emulator.
import { isAbsolute, join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const checkout = fileURLToPath(new URL('..', import.meta.url));

/** process.execPath's arguments that run `script` (a .ts file of this checkout: absolute, or relative to it) with `args`. */
export function nodeArgs(script: string, ...args: string[]): string[] {
  const build = process.env.TORPOR_TEST_BUILD;
  if (!build) return ['--import', 'tsx', script, ...args];
  const rel = isAbsolute(script) ? relative(checkout, script) : script;
  return [join(build, rel.replace(/\.ts$/, '.js')), ...args];
}

/** A module of this checkout as `import` takes it in a child's `-e` script: the .ts path (through
 *  tsx) or the build's .js file. */
export function moduleSpecifier(path: string): string {
  const build = process.env.TORPOR_TEST_BUILD;
  return build ? pathToFileURL(join(build, path.replace(/\.ts$/, '.js'))).href : `./${path}`;
}

/** process.execPath's arguments that run the ES module source `script` (its imports from moduleSpecifier). */
export function nodeEvalArgs(script: string): string[] {
  const tsx = process.env.TORPOR_TEST_BUILD ? [] : ['--import', 'tsx'];
  return [...tsx, '--input-type=module', '-e', script];
}
