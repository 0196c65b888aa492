// npm test's step before the JS tests: the guest artifacts the tests boot (our kernel, the
// Debian root filesystem, the agent) built into the store when missing, exactly as
// `torpor setup` builds them, so a fresh machine's `npm test` runs every test this host can
// run instead of skipping the ones that need artifacts. A warm store costs well under a second.
// Where they cannot be built (no root for the image, missing Debian packages), one message
// says why and what to do, and the tests that need them skip with that reason (recorded by
// test/skip-unless.ts); any other failure fails npm test.
import { TorporError } from '../lib/errors.js';
import { ensureArtifacts } from '../lib/setup/artifacts.js';
import { streamProgress } from '../lib/setup/progress.js';

const started = Date.now();
try {
  const report = await ensureArtifacts({ onProgress: streamProgress(process.stderr) });
  const what = report.built.length ? `built ${report.built.join(', ')}` : 'the store already had them';
  console.log(`test:prepare: guest artifacts in ${report.kernel ? 'the store' : '?'}: ${what} (${((Date.now() - started) / 1000).toFixed(1)} s)`);
} catch (err) {
  if (err instanceof TorporError && (err.code === 'MISSING_TOOLS' || err.code === 'PERMISSION_DENIED')) {
    console.log(`test:prepare: the guest artifacts cannot be built here (${err.code}): ${err.message}`);
    console.log('test:prepare: each test that needs them registers its skip through test/skip-unless.ts with this reason (counted, listed at the end); `npx torpor setup --install-deps` (as root) fixes it.');
  } else {
    throw err;
  }
}
