#!/usr/bin/env node
// The `torpor` command. In a checkout (lib/ present) it runs the TypeScript sources through
// tsx, so a dist/ left from an earlier build can never run stale code; the published package
// ships no lib/ and runs the compiled CLI from dist/.
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const source = join(root, 'lib', 'cli', 'main.ts');

let cli;
if (existsSync(source)) {
  const { register } = await import('tsx/esm/api');
  register();
  cli = await import(pathToFileURL(source).href);
} else {
  cli = await import(pathToFileURL(join(root, 'dist', 'cli', 'main.js')).href);
}
await cli.run(process.argv.slice(2));
