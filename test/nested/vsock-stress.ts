// Large vsock transfers against a real Linux guest, for as long as asked: the
// load under which the nested host showed triple faults, guest oopses and
// stalls (issue 13; docs/nested.md). Not part of any suite: run it by hand,
// on the nested host (npm run test:linux -- node --import tsx test/nested/vsock-stress.ts)
// or on a hardware host.
//
//   STRESS_SECONDS (default 300), STRESS_VCPUS (2), STRESS_MIB (50 per file), STRESS_MEMORY_MIB (512),
//   STRESS_PARALLEL (2: round trips in flight at once, so both vCPUs and the vsock queues stay busy),
//   STRESS_STALL_S (240: a round still running after this long gets the machine's state, stats and
//   console printed once, so a stall that a runner's timeout then kills still leaves evidence)
//
// Prints one line per round and a JSON summary; exits 1 at the first failure,
// after printing the machine's state, exit reason, stats and console tail.
import { createHash, randomBytes } from 'node:crypto';

import { Sandbox } from '../../lib/sandbox/sandbox.js';
import type { Machine } from '../../lib/vm/machine.js';

const seconds = Number(process.env.STRESS_SECONDS ?? 300);
const vcpus = Number(process.env.STRESS_VCPUS ?? 2);
const mib = Number(process.env.STRESS_MIB ?? 50);
const memoryMiB = Number(process.env.STRESS_MEMORY_MIB ?? 512);
const parallel = Number(process.env.STRESS_PARALLEL ?? 2);
const stallS = Number(process.env.STRESS_STALL_S ?? 240);

const sha = (b: Uint8Array): string => createHash('sha256').update(b).digest('hex');

const t0 = performance.now();
const elapsed = (): string => `${((performance.now() - t0) / 1000).toFixed(1)} s`;
const sbx = await Sandbox.create({ vcpus, memoryMiB, boot: { timeoutMs: 180_000 } });
// The machine behind the sandbox, for the failure report only.
const machine = (sbx as unknown as { machine: Machine }).machine;
console.log(`stress: sandbox up at ${elapsed()} (${vcpus} vCPUs, ${memoryMiB} MiB), ${parallel} x ${mib} MiB round trips at once for ${seconds} s`);

let rounds = 0;
let bytes = 0;
let failure: string | undefined;
// The live console tail; after a failure it can come back empty, and
// then the tail the exit reason kept at the moment the machine ended is what is left.
const consoleText = (): string => machine.consoleTail().toString('utf8') || machine.exitReason?.consoleTail || '';
const report = (): void => {
  console.log(`stress: machine state ${machine.state}, exit reason ${JSON.stringify(machine.exitReason)}`);
  console.log(`stress: stats ${JSON.stringify(machine.stats())}`);
  console.log(`stress: guest console tail:\n${consoleText().slice(-4000)}`);
};
const deadline = performance.now() + seconds * 1000;
try {
  while (performance.now() < deadline) {
    const r0 = performance.now();
    const stall = setTimeout(() => {
      console.log(`stress: round ${rounds + 1} still running after ${stallS} s (at ${elapsed()})`);
      report();
    }, stallS * 1000);
    stall.unref();
    const lengths = await Promise.all(
      Array.from({ length: parallel }, async (_, lane) => {
        const data = randomBytes(mib << 20);
        const path = `/tmp/blob${lane}`;
        await sbx.files.write(path, data);
        const back = await sbx.files.read(path, { format: 'bytes' });
        if (back.length !== data.length || sha(back) !== sha(data)) throw new Error(`round ${rounds} lane ${lane}: the file came back different (${back.length} bytes)`);
        const py = await sbx.commands.run(['python3', '-c', `import hashlib;print(hashlib.sha256(open('${path}','rb').read()).hexdigest())`]);
        if (py.stdout.trim() !== sha(data)) throw new Error(`round ${rounds} lane ${lane}: the guest hashed ${py.stdout.trim()}`);
        // The guest's /tmp is on its root disk: free it for the next round (a write goes to a temp file first).
        await sbx.files.remove(path);
        return data.length;
      }),
    ).finally(() => clearTimeout(stall));
    rounds++;
    bytes += 2 * lengths.reduce((a, b) => a + b, 0);
    console.log(`stress: round ${rounds} ok in ${((performance.now() - r0) / 1000).toFixed(1)} s (at ${elapsed()})`);
  }
} catch (err) {
  failure = err instanceof Error ? err.message : String(err);
  console.log(`stress: FAILED at ${elapsed()} after ${rounds} rounds: ${failure}`);
  report();
} finally {
  // A guest that survived can still have complained (an oops, a WARNING, an RCU stall): say so.
  const alarms = consoleText().split('\n').filter((l) => /Oops|BUG:|WARNING:|rcu.*stall|XSAVE consistency|general protection|double fault/i.test(l));
  console.log(`stress: guest console alarms: ${alarms.length ? '\n' + alarms.join('\n') : 'none'}`);
  await sbx.kill().catch(() => undefined);
}
console.log(JSON.stringify({ stress: failure ? 'failed' : 'passed', vcpus, mib, parallel, rounds, mibMoved: bytes / 2 ** 20, seconds: (performance.now() - t0) / 1000, failure }));
process.exit(failure ? 1 : 0);
