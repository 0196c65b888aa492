// docs/api.md is generated from the TSDoc of the public exports (scripts/api-docs.ts); this
// fails when a doc comment or an exported signature changed and the page was not regenerated,
// or when typedoc warns (an exported signature naming a type the package does not export).
import { readFileSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { API_DOC, anchorsOf, checkApiDoc } from '../scripts/api-docs.js';

test('docs/api.md is what `npm run docs:api` makes from the sources', () => {
  assert.is(checkApiDoc(), null);
});

test('it documents the public API: Sandbox, its calls, the error classes', () => {
  const page = readFileSync(API_DOC, 'utf8');
  for (const heading of ['### Sandbox', '### Template', '### Commands', '### Files', '### TorporError', '### SandboxNotFoundError'])
    assert.ok(page.includes(`\n${heading}\n`), heading);
  for (const call of ['static create(opts', 'static connect(sandboxId', 'pause(opts?): Promise<PauseResult>']) assert.ok(page.includes(call), call);
});

test("every link inside the page lands on one of its headings or anchors", () => {
  const page = readFileSync(API_DOC, 'utf8');
  const anchors = anchorsOf(page);
  const broken = [...page.matchAll(/\]\(#([\w-]+)\)/g)].map((m) => m[1]!).filter((a) => !anchors.has(a));
  assert.equal([...new Set(broken)], []);
});

test.run();
