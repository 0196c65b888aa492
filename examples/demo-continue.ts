// The second half of `npm run demo`: a new Node process continues a paused sandbox.
//   tsx examples/demo-continue.ts linux <id> <label>   tail -1 of the job's log, twice, 1 s apart
//   tsx examples/demo-continue.ts testvm <id> <label>  the test guest's counter, twice, 1 s apart
import type { Machine } from '../lib/vm/machine.js';
import { Sandbox } from '../lib/sandbox/sandbox.js';

const [kind, id, label] = process.argv.slice(2);
const started = performance.now();
const sbx = await Sandbox.connect(id!, { restoreTimeoutMs: 120_000 });
const connected = performance.now();
const read = async (): Promise<string> =>
  kind === 'linux'
    ? (await sbx.commands.run('tail -1 /tmp/job.log')).stdout.trim()
    : String((sbx as unknown as { machine: Machine }).machine.readGuest(0x100008, 8).readBigUInt64LE());
const first = await read();
const firstAt = performance.now();
await new Promise((r) => setTimeout(r, 1000));
const second = await read();
const info = await sbx.getInfo();
console.log(
  `[${label}] new process ${process.pid}: Sandbox.connect ${(connected - started).toFixed(0)} ms (from ${info.resumedFrom}), ` +
    `first output ${(firstAt - started).toFixed(0)} ms after connect was called`,
);
console.log(`[${label}] ${kind === 'linux' ? 'tail -1 /tmp/job.log' : 'counter'}: ${first}, one second later ${second}: the same job, still running`);
await sbx.kill();
