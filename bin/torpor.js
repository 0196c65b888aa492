#!/usr/bin/env node
// The `torpor` command. A published package runs the compiled CLI from dist/;
// a clean clone (no dist/ yet) runs the TypeScript sources through tsx.
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const compiled = join(root, 'dist', 'cli', 'main.js');

let cli;
if (existsSync(compiled)) {
  cli = await import(pathToFileURL(compiled).href);
} else {
  const { register } = await import('tsx/esm/api');
  register();
  cli = await import(pathToFileURL(join(root, 'lib', 'cli', 'main.ts')).href);
}
await cli.run(process.argv.slice(2));
