// Does a guest PAUSE spin keep L1's timer interrupt from L1 (docs/nested.md, "The emulated machine's own failures")?
// Runs pause-spin.c, built static here, in a 2-vCPU sandbox: rounds of plain spins, then of
// PAUSE spins; each should end in ~0.2 s.
//   flock /tmp/nested.lock npm run test:linux -- "node --import tsx test/nested/pause-spin.ts [plain,pause] [rounds]"
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { Sandbox } from '../../lib/sandbox/sandbox.js';

const modes = (process.argv[2] ?? 'plain,pause').split(',');
const rounds = Number(process.argv[3] ?? 10);
const binary = join(mkdtempSync(join(tmpdir(), 'pause-spin-')), 'pause-spin');
execFileSync('gcc', ['-O2', '-static', '-pthread', '-o', binary, fileURLToPath(new URL('./pause-spin.c', import.meta.url))]);

await using sbx = await Sandbox.create({ vcpus: 2, boot: { timeoutMs: 180_000 } });
await sbx.files.write('/tmp/pause-spin', readFileSync(binary));
for (const mode of modes) {
  const t0 = performance.now();
  const r = await sbx.commands.run(`chmod +x /tmp/pause-spin && /tmp/pause-spin ${mode} ${rounds}`, { timeoutMs: 1_800_000 });
  console.log(r.stdout.trim());
  console.log(`pause-spin: ${mode} done in ${((performance.now() - t0) / 1000).toFixed(1)} s (exit ${r.exitCode})`);
}
