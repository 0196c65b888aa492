// Prints the skips recorded in a TORPOR_SKIP_LOG file (see test/skip-unless.ts),
// for a log to end with. `--fail-on CATEGORY` (repeatable) exits 1 when a test of
// that category was skipped: a host that must run the Linux-guest suite uses
// `--fail-on linux-guest`. `--ran-elsewhere CATEGORY=WHERE` (repeatable) says that
// the tests of that category skipped here did run, and passed, elsewhere in the
// same CI run (the Linux-guest suite in the nested KVM host on a PVM host): they
// are listed apart from the skips, so the skip list holds only what never ran.
//   node --import tsx test/skip-report.ts [--fail-on C] [--ran-elsewhere C=WHERE] [LOG]
import { parseArgs } from 'node:util';

import { formatSkips, readSkipLog } from './skip-unless.js';

const { values, positionals } = parseArgs({
  options: {
    'fail-on': { type: 'string', multiple: true, default: [] },
    'ran-elsewhere': { type: 'string', multiple: true, default: [] },
  },
  allowPositionals: true,
});
const log = positionals[0] ?? process.env.TORPOR_SKIP_LOG;
if (!log) {
  console.error('skip-report: give the skip log (or set TORPOR_SKIP_LOG)');
  process.exit(2);
}
const elsewhere = new Map<string, string>();
for (const spec of values['ran-elsewhere']) {
  const eq = spec.indexOf('=');
  if (eq <= 0) {
    console.error(`skip-report: --ran-elsewhere ${spec}: expected CATEGORY=WHERE`);
    process.exit(2);
  }
  elsewhere.set(spec.slice(0, eq), spec.slice(eq + 1));
}
const records = readSkipLog(log);
const ranElsewhere = records.filter((r) => elsewhere.has(r.category));
const skipped = records.filter((r) => !elsewhere.has(r.category));
for (const [category, where] of elsewhere) {
  const moved = ranElsewhere.filter((r) => r.category === category);
  if (moved.length) {
    const files = [...new Set(moved.map((r) => r.file))].join(', ');
    process.stdout.write(`not run on this host, run instead ${where}: ${moved.length} [${category}] test(s) of ${files}\n`);
  }
}
process.stdout.write(formatSkips(skipped));
const forbidden = skipped.filter((r) => values['fail-on'].includes(r.category));
if (forbidden.length) {
  console.error(`skip-report: ${forbidden.length} test(s) of category ${[...new Set(forbidden.map((r) => r.category))].join(', ')} skipped where they must run`);
  process.exit(1);
}
