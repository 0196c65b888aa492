// `npm run bench:report`: docs/benchmarks.md, a chart per family (docs/benchmarks/<id>.svg) and
// the README's performance block (between <!-- bench:begin --> and <!-- bench:end -->), all from
// bench/results/*.json. `-- --check` writes nothing and fails, naming the files, when any of them
// differs from what the stored results give (test/docs-benchmarks.test.ts runs the same check).
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { barChart, lineChart } from './docs/chart.js';
import { SPECS, familyOf, type Family } from './docs/families.js';
import { benchmarksPage, readmeBlock } from './docs/markdown.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const BEGIN = '<!-- bench:begin -->';
const END = '<!-- bench:end -->';

export function readFamilies(resultsDir = join(root, 'bench', 'results')): Family[] {
  return SPECS.filter((s) => existsSync(join(resultsDir, `${s.id}.json`))).map((s) =>
    familyOf(s, JSON.parse(readFileSync(join(resultsDir, `${s.id}.json`), 'utf8')) as Record<string, unknown>),
  );
}

/** The README with its block replaced (the markers must be there, once each, in order). */
export function withReadmeBlock(readme: string, block: string): string {
  const b = readme.indexOf(BEGIN);
  const e = readme.indexOf(END);
  if (b < 0 || e < b || readme.indexOf(BEGIN, b + 1) >= 0 || readme.indexOf(END, e + 1) >= 0)
    throw new Error(`README.md needs one ${BEGIN} ... ${END} block (in that order) for the benchmark figures; add the two markers where the figures belong`);
  return `${readme.slice(0, b + BEGIN.length)}\n${block}\n${readme.slice(e)}`;
}

/** Every generated file (path relative to the checkout -> content). */
export function generate(readme = readFileSync(join(root, 'README.md'), 'utf8')): Map<string, string> {
  const families = readFamilies();
  const files = new Map<string, string>();
  files.set('docs/benchmarks.md', benchmarksPage(families));
  for (const f of families) files.set(`docs/benchmarks/${f.id}.svg`, f.series ? lineChart(f) : barChart(f));
  files.set('README.md', withReadmeBlock(readme, readmeBlock(families)));
  return files;
}

/** The generated files that differ from what is stored (empty: all current). */
export function staleFiles(): string[] {
  const stale: string[] = [];
  for (const [path, content] of generate()) {
    const full = join(root, path);
    if (!existsSync(full) || readFileSync(full, 'utf8') !== content) stale.push(path);
  }
  return stale;
}

function main(check: boolean): number {
  if (check) {
    const stale = staleFiles();
    if (stale.length) {
      console.error(`stale (run \`npm run bench:report\` and commit): ${stale.join(', ')}`);
      return 1;
    }
    console.log('the benchmark docs are current');
    return 0;
  }
  const files = generate();
  mkdirSync(join(root, 'docs', 'benchmarks'), { recursive: true });
  for (const [path, content] of files) writeFileSync(join(root, path), content);
  console.log('wrote docs/benchmarks.md, docs/benchmarks/*.svg and the README block');
  return 0;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  try {
    process.exitCode = main(process.argv.includes('--check'));
  } catch (err) {
    console.error(`bench:report: ${err instanceof Error ? err.message : String(err)}`);
    process.exitCode = 1;
  }
}
