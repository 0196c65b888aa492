// Runs every benchmark module in bench/ (each exports a run<Name>Bench()
// returning { rows, json }), writes bench/results/<name>.json and prints one
// table per module. `npm run bench`, or `tsx bench/run.ts vmm agent` for some. Scripts with their
// own command line (soak.ts, seccomp.ts: an exported main(), run when started directly) run only
// when named, with their defaults, and write their own JSON.
import { readdirSync, readFileSync } from 'node:fs';
import { mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { loadNow, machineRecord } from './machine.js';
import { formatTable } from './report.js';

type BenchFn = () => Promise<{ rows: Array<{ name: string }>; json: unknown }>;

const here = dirname(fileURLToPath(import.meta.url));
const only = process.argv.slice(2);
const sources = readdirSync(here)
  .filter((f) => f.endsWith('.ts'))
  .map((f) => ({ name: f.slice(0, -3), text: readFileSync(join(here, f), 'utf8') }));
const isBench = (text: string) => /^export (async )?function run\w*Bench\b/m.test(text);
const isScript = (text: string) => /^export async function main\(/m.test(text);
const modules = sources
  .filter(({ name, text }) => (only.length === 0 ? isBench(text) : only.includes(name) && (isBench(text) || isScript(text))))
  .map(({ name }) => name)
  .sort();
let failed = 0;
for (const name of only)
  if (!modules.includes(name)) {
    failed++;
    console.log(`${name}: no bench/${name}.ts with a run*Bench or main export`);
  }
for (const name of modules) {
  const mod = (await import(pathToFileURL(join(here, `${name}.ts`)).href)) as Record<string, unknown>;
  // run<Name>Bench for bench/<name>.ts (a module may export other run*Bench helpers, e.g. pause.ts's Linux one).
  const own = `run${name.replace(/(^|-)(\w)/g, (_m, _d, c: string) => c.toUpperCase())}Bench`;
  const fnName = typeof mod[own] === 'function' ? own : Object.keys(mod).find((k) => /^run\w*Bench$/.test(k) && typeof mod[k] === 'function');
  if (!fnName) {
    console.log(`\n== ${name} (its own script, defaults) ==`);
    try {
      await (mod.main as (argv: string[]) => Promise<void>)([]);
    } catch (err) {
      failed++;
      console.log(`${name}: failed: ${err instanceof Error ? err.stack ?? err.message : String(err)}`);
    }
    continue;
  }
  console.log(`\n== ${name} ==`);
  const load = loadNow();
  try {
    const result = await (mod[fnName] as BenchFn)();
    console.log(formatTable(result.rows));
    const out = join(here, 'results', `${name}.json`);
    await mkdir(dirname(out), { recursive: true });
    const json = result.json && typeof result.json === 'object' && !('machine' in result.json) ? { ...result.json, machine: machineRecord(load) } : result.json;
    await writeFile(out, JSON.stringify(json, null, 2) + '\n');
    console.log(`wrote ${out}`);
  } catch (err) {
    failed++;
    console.log(`${name}: failed: ${err instanceof Error ? err.stack ?? err.message : String(err)}`);
  }
}
process.exitCode = failed ? 1 : 0;
