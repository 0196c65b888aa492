// examples/node-project.ts's second process: continues the paused sandbox, runs `npm test` in the
// project, kills the sandbox. usage: node-project-continue.ts <id> <dir> <tag>
import { Sandbox } from '../lib/sandbox/sandbox.js';

const [id, dir, tag] = process.argv.slice(2);
const t0 = performance.now();
const sbx = await Sandbox.connect(id!, { restoreTimeoutMs: 120_000, bootTimeoutMs: 240_000 });
const info = await sbx.getInfo();
console.log(`${tag} process ${process.pid} connected in ${((performance.now() - t0) / 1000).toFixed(1)} s (resumed from ${info.resumedFrom})`);
const r = await sbx.commands.run('npm test', { cwd: dir!, throwOnError: false, timeoutMs: 300_000 });
console.log(`${tag} npm test -> exit ${r.exitCode}: ${r.stdout.trim().split('\n').pop()}`);
await sbx.kill();
process.exitCode = r.exitCode === 0 ? 0 : 1;
