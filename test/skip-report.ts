// Prints the skips recorded in a TORPOR_SKIP_LOG file (see test/skip-unless.ts),
// for a log to end with. `--fail-on CATEGORY` (repeatable) exits 1 when a test of
// that category was skipped: a host that must run the Linux-guest suite uses
// `--fail-on linux-guest`.
//   node --import tsx test/skip-report.ts [--fail-on linux-guest] [LOG]
import { parseArgs } from 'node:util';

import { formatSkips, readSkipLog } from './skip-unless.js';

const { values, positionals } = parseArgs({ options: { 'fail-on': { type: 'string', multiple: true, default: [] } }, allowPositionals: true });
const log = positionals[0] ?? process.env.TORPOR_SKIP_LOG;
if (!log) {
  console.error('skip-report: give the skip log (or set TORPOR_SKIP_LOG)');
  process.exit(2);
}
const records = readSkipLog(log);
process.stdout.write(formatSkips(records));
const forbidden = records.filter((r) => values['fail-on'].includes(r.category));
if (forbidden.length) {
  console.error(`skip-report: ${forbidden.length} test(s) of category ${[...new Set(forbidden.map((r) => r.category))].join(', ')} skipped where they must run`);
  process.exit(1);
}
