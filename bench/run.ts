// Runs every benchmark module in bench/ (each exports a run<Name>Bench()
// returning { rows, json }), writes bench/results/<name>.json and prints one
// table per module. `npm run bench`, or `tsx bench/run.ts vmm agent` for some. Scripts that run
// by themselves (soak.ts, seccomp.ts) are not imported: they would start on import.
import { readdirSync, readFileSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { machineRecord } from './machine.js';
import { formatTable } from './report.js';

type BenchFn = () => Promise<{ rows: Array<{ name: string }>; json: unknown }>;

const here = dirname(fileURLToPath(import.meta.url));
const only = process.argv.slice(2);
const modules = readdirSync(here)
  .filter((f) => f.endsWith('.ts') && /^export (async )?function run\w*Bench\b/m.test(readFileSync(join(here, f), 'utf8')))
  .map((f) => f.slice(0, -3))
  .filter((name) => only.length === 0 || only.includes(name))
  .sort();

let failed = 0;
for (const name of modules) {
  const mod = (await import(pathToFileURL(join(here, `${name}.ts`)).href)) as Record<string, unknown>;
  // run<Name>Bench for bench/<name>.ts (a module may export other run*Bench helpers, e.g. pause.ts's Linux one).
  const own = `run${name.replace(/(^|-)(\w)/g, (_m, _d, c: string) => c.toUpperCase())}Bench`;
  const fnName = typeof mod[own] === 'function' ? own : Object.keys(mod).find((k) => /^run\w*Bench$/.test(k) && typeof mod[k] === 'function');
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
    const json = result.json && typeof result.json === 'object' && !('machine' in result.json) ? { ...result.json, machine: machineRecord() } : result.json;
    await writeFile(out, JSON.stringify(json, null, 2) + '\n');
    console.log(`wrote ${out}`);
  } catch (err) {
    failed++;
    console.log(`${name}: failed: ${err instanceof Error ? err.stack ?? err.message : String(err)}`);
  }
}
process.exitCode = failed ? 1 : 0;
