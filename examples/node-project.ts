// npm run demo:node: the post's flow. A template from a node image; a sandbox from it clones a
// project from a git server, `npm install`s it from an npm registry, is paused, and a new Node
// process continues it and runs `npm test`.
//   npm run demo:node                      the node image of the tests (Debian's nodejs and npm,
//                                          an OCI layout built once with mmdebstrap; offline), a
//                                          git server and a verdaccio registry on 127.0.0.1
//   npm run demo:node -- --image node:22   the real node:22 from Docker Hub instead
// Where Linux cannot boot natively (PVM, or no /dev/kvm), it runs in the nested KVM host (emulated).
import { spawnSync } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { detectHost } from '../lib/setup/host.js';
import { homeLayout } from '../lib/store/home.js';
import { Template, type TemplateFrom } from '../lib/template/template.js';
import { makeProjectRepo, startGitServer } from '../test/fixtures/git-server.js';
import { guestUrl, publishPackage, startNpmRegistry, writeLeftPad } from '../test/fixtures/npm-registry.js';
import { ensureNodeImage, nodeImageSkipReason } from '../test/image-fixtures/node-image.js';
import { runInNestedHost } from './nested-host.js';

const nested = process.env.TORPOR_NESTED === '1';
const tag = nested ? '[node, nested, EMULATED]' : '[node]';
const imageArg = process.argv.indexOf('--image');
const image = imageArg > 0 ? process.argv[imageArg + 1] : undefined;
const s = (t0: number) => `${((performance.now() - t0) / 1000).toFixed(1)} s`;

async function demo(): Promise<number> {
  let from: TemplateFrom;
  if (image) from = { image };
  else {
    const store = homeLayout().artifacts;
    const why = await nodeImageSkipReason(store);
    if (why) {
      console.log(`${tag} ${why}; or pull a real one: npm run demo:node -- --image node:22`);
      return 1;
    }
    from = { ociLayout: (await ensureNodeImage(store, { onProgress: (l) => console.log(`${tag} node image: ${l}`) })).dir };
  }
  const scratch = await mkdtemp(join(tmpdir(), 'torpor-demo-node-'));
  const registry = await startNpmRegistry();
  let git: Awaited<ReturnType<typeof startGitServer>> | undefined;
  try {
    const pkg = join(scratch, 'left-pad');
    await writeLeftPad(pkg);
    await publishPackage(registry.url, pkg);
    git = await startGitServer({ repoDir: await makeProjectRepo(join(scratch, 'repos')) });
    console.log(`${tag} git server ${git.url}, npm registry ${registry.url} (the sandbox reaches them at 10.0.2.2)`);

    let t0 = performance.now();
    let last = '';
    const t = await Template.build({
      name: 'node-demo',
      from,
      resources: { cpu: 2, memoryMb: 1024, diskMb: 4096 },
      onProgress: (p) => {
        if (p.phase === 'download' || p.phase === 'step' || !('message' in p)) return;
        const line = `${tag} template: ${p.phase}: ${p.message}`;
        if (line !== last) console.log(line); // byte counts repeat a message as they advance
        last = line;
      },
    });
    console.log(`${tag} template node-demo built in ${s(t0)} (${JSON.stringify(t.timings)}); user ${t.user || 'root'}, workdir ${t.workdir || '(home)'}`);

    t0 = performance.now();
    const sbx = await Sandbox.create({ template: 'node-demo', network: { allowHostLoopback: true } });
    console.log(`${tag} ${sbx.sandboxId} from the template in ${s(t0)}: node ${(await sbx.commands.run('node --version')).stdout.trim()}`);
    // In the user's home (the image's user: `node` in the test image, root in node:22), on disk.
    const dir = `${(await sbx.commands.run('echo $HOME')).stdout.trim()}/project`;
    await sbx.commands.run(`git clone ${guestUrl(git.url)} ${dir}`, { timeoutMs: 180_000 });
    t0 = performance.now();
    const install = await sbx.commands.run(`npm install --registry ${guestUrl(registry.url)} --no-audit --no-fund`, { cwd: dir, timeoutMs: 600_000 });
    console.log(`${tag} git clone + npm install in ${s(t0)}: ${install.stdout.trim().split('\n').pop()}`);
    const p = await sbx.pause();
    console.log(`${tag} paused: generation ${p.generation}, ${(p.bytes / 2 ** 20).toFixed(1)} MiB written; continuing in a new Node process`);
    const c = spawnSync(process.execPath, ['--import', 'tsx', 'examples/node-project-continue.ts', sbx.sandboxId, dir, tag], {
      cwd: fileURLToPath(new URL('..', import.meta.url)),
      stdio: 'inherit',
    });
    return c.status ?? 1;
  } finally {
    await git?.close().catch(() => undefined);
    await registry.close().catch(() => undefined);
    await Template.remove('node-demo', { force: true }).catch(() => undefined);
    await rm(scratch, { recursive: true, force: true });
  }
}

const support = await linuxGuestSupport();
if (support.ok) {
  process.exitCode = await demo();
} else if (nested) {
  console.log(`The nested KVM host cannot boot a Linux guest either: ${support.reason}`);
  process.exitCode = 1;
} else {
  process.exitCode = runInNestedHost(await detectHost(), 'examples/node-project.ts');
}
