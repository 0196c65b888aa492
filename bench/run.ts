// Runs every benchmark module in bench/ (each exports a run<Name>Bench()
// returning { rows, json }), writes bench/results/<name>.json and prints one
// table per module. `npm run bench`, or `tsx bench/run.ts vmm agent` for some.
import { readdirSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { formatTable } from './report.js';

type BenchFn = () => Promise<{ rows: Array<{ name: string }>; json: unknown }>;

const here = dirname(fileURLToPath(import.meta.url));
const only = process.argv.slice(2);
const modules = readdirSync(here)
  .filter((f) => f.endsWith('.ts') && !['run.ts', 'report.ts'].includes(f))
  .map((f) => f.slice(0, -3))
  .filter((name) => only.length === 0 || only.includes(name))
  .sort();

let failed = 0;
for (const name of modules) {
  const mod = (await import(pathToFileURL(join(here, `${name}.ts`)).href)) as Record<string, unknown>;
  const fnName = Object.keys(mod).find((k) => /^run\w*Bench$/.test(k) && typeof mod[k] === 'function');
  if (!fnName) {
    console.log(`${name}: no run*Bench export, skipped`);
    continue;
  }
  console.log(`\n== ${name} ==`);
  try {
    const result = await (mod[fnName] as BenchFn)();
    console.log(formatTable(result.rows));
    const out = join(here, 'results', `${name}.json`);
    await mkdir(dirname(out), { recursive: true });
    await writeFile(out, JSON.stringify(result.json, null, 2) + '\n');
    console.log(`wrote ${out}`);
  } catch (err) {
    failed++;
    console.log(`${name}: failed: ${err instanceof Error ? err.stack ?? err.message : String(err)}`);
  }
}
process.exitCode = failed ? 1 : 0;
