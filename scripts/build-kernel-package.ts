// npm run build:kernel-package: the per-platform package of the prebuilt guest
// (packages/kernel-linux-x64: the kernel and the static agent) and torpor's release record
// of it (kernel-release.json at the package root, shipped in torpor's tarball), made in one
// step so the two always agree. The kernel is built from guest/kernel as `torpor setup` builds
// it (the store's copy is reused when its inputs have not changed; guest/kernel/build.sh pins
// the version banner, so the same inputs give the same bytes), the agent by its Makefile.
//
//   node --import tsx scripts/build-kernel-package.ts [--out DIR] [--record FILE] [--json]
//
// --out defaults to packages/kernel-linux-x64, --record to kernel-release.json in this
// checkout. Then `npm pack` in both directories gives the two tarballs a release publishes.
import { chmod, copyFile, readFile, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

import { ensureAgent } from '../lib/setup/agent.js';
import { builtKernel, builtKernelSpec } from '../lib/setup/kernel.js';
import { type KernelRelease, PACKAGE_FILES, RELEASE_RECORD, kernelPackageName, parseRelease } from '../lib/setup/kernel-package.js';
import { packageRoot } from '../lib/setup/paths.js';
import { streamProgress } from '../lib/setup/progress.js';
import { sha256File } from '../lib/store/hash.js';
import { homeLayout, torporHome } from '../lib/store/home.js';

const { values } = parseArgs({
  options: {
    out: { type: 'string', default: join(packageRoot, 'packages', 'kernel-linux-x64') },
    record: { type: 'string', default: join(packageRoot, RELEASE_RECORD) },
    json: { type: 'boolean', default: false },
  },
});
const out = values.out!;

async function writeAtomically(path: string, text: string): Promise<void> {
  await writeFile(`${path}.tmp`, text);
  await rename(`${path}.tmp`, path);
}

const started = Date.now();
const root = homeLayout(torporHome()).artifacts;
const progress = streamProgress(process.stderr);
const spec = await builtKernelSpec(progress);
const kernel = await builtKernel(root, false, progress, spec);
const agent = await ensureAgent(root, false, undefined, progress);

const torpor = JSON.parse(await readFile(join(packageRoot, 'package.json'), 'utf8')) as { version: string };
const pkgJsonPath = join(out, 'package.json');
const pkgJson = JSON.parse(await readFile(pkgJsonPath, 'utf8')) as { name: string; version: string };
const name = kernelPackageName();
if (pkgJson.name !== name) throw new Error(`${pkgJsonPath} names ${pkgJson.name}, not ${name}`);
// The package's version is torpor's: a release publishes the two together.
if (pkgJson.version !== torpor.version) {
  pkgJson.version = torpor.version;
  await writeAtomically(pkgJsonPath, JSON.stringify(pkgJson, null, 2) + '\n');
}

for (const [from, file] of [
  [kernel.path, PACKAGE_FILES.kernel],
  [agent.path, PACKAGE_FILES.agent],
] as const) {
  await copyFile(from, `${join(out, file)}.tmp`);
  await chmod(`${join(out, file)}.tmp`, file === PACKAGE_FILES.agent ? 0o755 : 0o644);
  await rename(`${join(out, file)}.tmp`, join(out, file));
}
// Hash what was written, not what was meant to be.
const [kernelSha, agentSha] = await Promise.all([sha256File(join(out, PACKAGE_FILES.kernel)), sha256File(join(out, PACKAGE_FILES.agent))]);
if (kernelSha !== kernel.sha256) throw new Error(`the kernel changed while it was copied (${kernelSha} != ${kernel.sha256})`);
if (agentSha !== agent.sha256) throw new Error(`the agent changed while it was copied (${agentSha} != ${agent.sha256})`);

const release: KernelRelease = {
  package: name,
  version: torpor.version,
  kernel: {
    file: PACKAGE_FILES.kernel,
    sha256: kernelSha,
    size: kernel.info.size || kernel.artifact.manifest.files.vmlinux!.size,
    linux: String(spec.inputs['linux-source-6.1']).trim(),
  },
  agent: { file: PACKAGE_FILES.agent, sha256: agentSha, size: agent.artifact.manifest.files['torpor-agent']!.size },
};
const text = JSON.stringify(release, null, 2) + '\n';
parseRelease(text, 'the new record'); // what torpor will read must parse
await writeAtomically(join(out, 'manifest.json'), text);
await writeAtomically(values.record!, text);

const summary = { ...release, out, record: values.record, storeKey: kernel.artifact.key, seconds: (Date.now() - started) / 1000 };
if (values.json) process.stdout.write(JSON.stringify(summary, null, 2) + '\n');
else
  process.stdout.write(
    `${name}@${release.version} in ${out}\n` +
      `  vmlinux       ${release.kernel.size} bytes  sha256 ${kernelSha}  (Linux ${release.kernel.linux}, store key ${kernel.artifact.key})\n` +
      `  torpor-agent  ${release.agent.size} bytes  sha256 ${agentSha}\n` +
      `record: ${values.record}\n`,
  );
