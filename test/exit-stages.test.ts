// The Node process (or worker) ends at every stage of a machine's life and
// exits cleanly: the env cleanup hook (natural end, worker end) or the
// atexit handler (process.exit, uncaught exception) stops the vCPU and I/O
// threads before anything they touch goes away. Each case is a child process
// running test/fixtures/exit-stage.ts.
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { kvmSkipReason } from './vmm-guests.js';
import { bound } from './bounds.js';
import { testUnless } from './skip-unless.js';
import { nodeArgs } from './child-node.js';

const kvmTest = testUnless('exit-stages', kvmSkipReason(), 'kvm');

const fixture = fileURLToPath(new URL('./fixtures/exit-stage.ts', import.meta.url));
const stages = ['created', 'running', 'paused', 'during-pause', 'stopped'] as const;
const ways = ['exit', 'natural', 'throw', 'worker'] as const;
const CRASH = /FATAL ERROR|Segmentation fault|Aborted|terminate called|core dumped|double free|napi_|SIGABRT|SIGSEGV/;

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  out: string;
  err: string;
}

// A child still alive after this is hung (it is killed and the test fails). Inside the nested
// KVM host (TORPOR_NESTED=1) everything, Node's own start included, runs emulated and several
// times slower: one child once took more than 30 s there under load without hanging.
const HANG_MS = bound(30_000);

function run(stage: string, how: string): Promise<Run> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, nodeArgs(fixture, stage, how), { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), HANG_MS);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, out, err });
    });
  });
}

async function pool<T, R>(items: T[], width: number, fn: (t: T) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: width }, async () => {
      while (next < items.length) {
        const i = next++;
        results[i] = await fn(items[i]!);
      }
    }),
  );
  return results;
}

kvmTest('exit, natural end, uncaught exception and worker end at every stage exit cleanly', async () => {
  const cases = stages.flatMap((stage) => ways.map((how) => ({ stage, how })));
  const results = await pool(cases, 2, async (c) => ({ ...c, r: await run(c.stage, c.how) }));
  const failures: string[] = [];
  for (const { stage, how, r } of results) {
    const what = `${stage}/${how}: code=${r.code} signal=${r.signal} stderr=${JSON.stringify(r.err.slice(-400))}`;
    const expectedCode = how === 'throw' ? 1 : 0;
    if (r.signal !== null || r.code !== expectedCode) failures.push(`${what} (expected exit code ${expectedCode})`);
    else if (!r.out.includes(`reached ${stage}`)) failures.push(`${what}: the stage was not reached: ${r.out}`);
    else if (CRASH.test(r.err) || CRASH.test(r.out)) failures.push(`${what}: crash output`);
    else if (how === 'throw' && !r.err.includes(`deliberate uncaught exception at ${stage}`)) failures.push(`${what}: no exception report`);
    // The guests printed their banner: the serial console reaches JS as
    // events and the console log, never the host process's own stdout/stderr.
    else if (/torpor-fixture: hello/.test(r.out + r.err)) failures.push(`${what}: guest console output on stdio`);
    else if (how === 'worker' && !r.out.includes('worker exited 0, torpor threads left: 0'))
      failures.push(`${what}: worker did not end cleanly: ${r.out}`);
  }
  assert.equal(failures, [], failures.join('\n'));
});

test.run();
