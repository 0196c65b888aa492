// docs/benchmarks.md, its charts and the README's performance block are generated from
// bench/results/*.json (bench/docs.ts): this fails when one is stale, and checks that figures on
// the page are the JSON's and that a result without a machine says so rather than guessing one.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { generate, staleFiles, withReadmeBlock } from '../bench/docs.js';
import { SPECS, familyOf, machineOf } from '../bench/docs/families.js';
import { num } from '../bench/docs/format.js';
import { summarize } from '../bench/report.js';
import { packageRoot } from '../lib/setup/paths.js';

test('the stored docs are what `npm run bench:report` makes from bench/results', () => {
  assert.equal(staleFiles(), []);
});

test("the page's figures are the JSON's: each row's p50 and p99 appear in its family's table", () => {
  const page = readFileSync(join(packageRoot, 'docs', 'benchmarks.md'), 'utf8');
  for (const id of ['template', 'pause', 'vmm', 'agent']) {
    const json = JSON.parse(readFileSync(join(packageRoot, 'bench', 'results', `${id}.json`), 'utf8')) as { rows: Array<{ name: string; p50?: number; p99?: number; mean?: number; n: number }> };
    const section = page.slice(page.indexOf(`<a id="${id}"></a>`));
    for (const r of json.rows.filter((r) => r.n > 0 && r.p50 !== undefined)) {
      const line = section.split('\n').find((l) => l.startsWith(`| ${r.name.trim().replace(/\|/g, '\\|')} |`));
      assert.ok(line, `${id}: a row for ${r.name}`);
      assert.ok(line!.includes(`| ${num(r.p50)} | ${num(r.p99)} | ${num(r.mean)} |`), `${id}: ${r.name}: ${line}`);
    }
  }
});

test('a result names its machine; one that does not is "machine not recorded", never a guess', () => {
  assert.is(machineOf({ date: '2026-01-01', rows: [] }), 'machine not recorded');
  assert.match(machineOf({ machine: { cpu: 'AMD EPYC', cores: 2, memoryGiB: 24, kernel: '6.18', kvm: 'pvm', node: 'v20' } }), /AMD EPYC, 2 cores, 24 GiB, Linux 6\.18, PVM host/);
  const home = { type: 'ext4', journal: false };
  assert.match(machineOf({ machine: { cpu: 'AMD EPYC', cores: 2, memoryGiB: 24, kernel: '6.18', kvm: 'pvm', node: 'v20', home } }), /PVM host[^,]*, TORPOR_HOME on ext4 without a journal, Node v20/);
  const fam = familyOf(SPECS.find((s) => s.id === 'sandbox')!, { date: '2026-01-02T00:00:00Z', rows: [{ name: 'x', n: 3, unit: 'ms', p50: 1.5 }] });
  assert.is(fam.machine, 'machine not recorded');
  assert.equal(fam.figures, [{ name: 'x', unit: 'ms', n: 3, p50: 1.5 }]);
});

test('the README block is replaced between its markers, and missing markers are an error', () => {
  assert.is(withReadmeBlock('a\n<!-- bench:begin -->\nold\n<!-- bench:end -->\nb\n', 'new'), 'a\n<!-- bench:begin -->\nnew\n<!-- bench:end -->\nb\n');
  assert.throws(() => withReadmeBlock('no markers', 'new'), /bench:begin/);
  assert.throws(() => generate('# a README without the markers\n'), /README\.md needs one <!-- bench:begin -->/);
  const files = generate();
  assert.ok(files.get('README.md')!.includes('docs/benchmarks.md'));
  assert.ok([...files.keys()].every((p) => p === 'README.md' || p.startsWith('docs/benchmarks')));
});

const page = () => readFileSync(join(packageRoot, 'docs', 'benchmarks.md'), 'utf8');
const section = (id: string) => {
  const text = page();
  const start = text.indexOf(`<a id="${id}"></a>`);
  const next = text.indexOf('<a id=', start + 1);
  return text.slice(start, next < 0 ? undefined : next);
};
const result = (id: string) => JSON.parse(readFileSync(join(packageRoot, 'bench', 'results', `${id}.json`), 'utf8')) as Record<string, unknown>;

test("net.json's figures are its samples' p50 (its old format has no rows)", () => {
  const net = result('net') as { startsMs: number[] };
  const start = section('net').split('\n').find((l) => l.startsWith('| passt start (spawn to ready) |'))!;
  assert.ok(start.includes(`| ${net.startsMs.length} | ${num(summarize(net.startsMs).p50)} |`), start);
});

test('each section names the machine its JSON records, or says it was not recorded', () => {
  for (const spec of SPECS) {
    let json: Record<string, unknown>;
    try {
      json = result(spec.id);
    } catch {
      continue; // no stored result for this family
    }
    assert.ok(section(spec.id).includes(`Measured on: ${machineOf(json)}`), spec.id);
  }
});

test("the README block's headline figures are the JSON's, each with its machine", () => {
  const readme = readFileSync(join(packageRoot, 'README.md'), 'utf8');
  const block = readme.slice(readme.indexOf('<!-- bench:begin -->'), readme.indexOf('<!-- bench:end -->'));
  const fig = (id: string, name: RegExp) => ((result(id).rows as Array<{ name: string; p50?: number; value?: number }>).find((r) => name.test(r.name))!);
  const create = fig('template', /^Sandbox\.create from the template/);
  assert.ok(block.includes(`| ${num(create.p50)} ms p50 |`), 'create from a template');
  const pause = fig('pause', /sbx\.pause\(\) in all/);
  assert.ok(block.includes(`| ${num(pause.p50)} ms p50 |`), 'pause');
  const exit = fig('vmm', /^PIO exit round trip/);
  assert.ok(block.includes(`| ${num(exit.value)} us (mean of `), 'PIO exit');
  for (const id of ['template', 'pause', 'vmm']) assert.ok(block.includes(machineOf(result(id), false)), `${id}'s machine`);
});

test.run();
