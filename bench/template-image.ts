// Templates from a container image (lib/template, lib/image), side by side in one run on a host
// whose /dev/kvm boots Linux:
//   - a template build from an image already fetched once (the node image of the tests, an OCI
//     layout from Debian's nodejs and npm packages), broken down: import (blobs verified into the
//     store), unpack (flatten + ext4 + agent), boot (the image's automatic template), steps,
//     capture;
//   - Sandbox.create from that template -> first command's output, against `base` in the same
//     run, interleaved (target: equal within noise);
//   - bytes on disk of a sandbox after `npm install` of the small test project, beyond its template.
// Runs in a temporary TORPOR_HOME whose artifacts/ links to the real store. Where Linux cannot boot
// (no /dev/kvm, PVM without its kernel) it says so and measures nothing: emulated figures from the
// nested host are not published.
import { mkdtempSync, readdirSync } from 'node:fs';
import { mkdtemp, rm, symlink } from 'node:fs/promises';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';

import { fetchImage } from '../lib/image/index.js';
import { imageRootfs } from '../lib/image/rootfs.js';
import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { sha256File } from '../lib/store/hash.js';
import { homeLayout } from '../lib/store/home.js';
import { Template } from '../lib/template/template.js';
import { makeProjectRepo, startGitServer } from '../test/fixtures/git-server.js';
import { guestUrl, publishPackage, startNpmRegistry, writeLeftPad } from '../test/fixtures/npm-registry.js';
import { ensureNodeImage, nodeImageSkipReason } from '../test/image-fixtures/node-image.js';
import { type BenchRow, formatTable, summarize } from './report.js';

const MiB = 1 << 20;

export async function runTemplateImageBench(opts: { iterations?: number } = {}): Promise<{ rows: BenchRow[]; json: unknown }> {
  const n = opts.iterations ?? 10;
  const rows: BenchRow[] = [];
  const store = homeLayout().artifacts;
  const noImage = await nodeImageSkipReason(store);
  if (noImage) {
    rows.push({ name: 'template from a container image', n: 0, unit: 'ms', note: `not measured: ${noImage}` });
    return { rows, json: { bench: 'template-image', date: new Date().toISOString(), host: hostname(), measured: false, reason: noImage, rows } };
  }
  const layout = (await ensureNodeImage(store)).dir;
  // The host-side half needs no KVM: the image's blobs verified into a fresh store, then its
  // layers flattened into an ext4 with the agent (what a template build does before booting).
  const hostSide = await measureImport(layout, store, Math.min(n, 3));
  rows.push(...hostSide.rows);
  const support = await linuxGuestSupport();
  if (!support.ok) {
    const why = `this host cannot boot a Linux guest (${support.reason})`;
    rows.push({ name: 'template boot, steps, capture; create -> first output', n: 0, unit: 'ms', note: `not measured: ${why}` });
    return { rows, json: { bench: 'template-image', date: new Date().toISOString(), host: hostname(), measured: 'host-side only', reason: why, rows, hostSide: hostSide.samples } };
  }
  const saved = process.env.TORPOR_HOME;
  const home = mkdtempSync(join(tmpdir(), 'torpor-bench-template-image-'));
  await symlink(store, join(home, 'artifacts'));
  process.env.TORPOR_HOME = home;
  const scratch = await mkdtemp(join(tmpdir(), 'torpor-bench-npm-'));
  const registry = await startNpmRegistry();
  let git: Awaited<ReturnType<typeof startGitServer>> | undefined;
  try {
    const res = { cpu: 2, memoryMb: 512 };
    const t0 = performance.now();
    const built = await Template.build({ name: 'node', from: { ociLayout: layout }, steps: [{ run: 'node --version' }], resources: res });
    const buildMs = performance.now() - t0;
    const t = built.timings ?? {};
    rows.push({ name: 'template build from the node image (OCI layout, first in this home)', n: 1, unit: 'ms', value: buildMs });
    for (const phase of ['pull', 'unpack', 'boot', 'restore', 'steps', 'capture']) {
      if (t[phase] !== undefined) rows.push({ name: `  ${phase}`, n: 1, unit: 'ms', value: t[phase] });
    }
    // Interleaved: from the node template, and from base, same size.
    const fromNode: number[] = [];
    const fromBase: number[] = [];
    for (let i = 0; i < n + 1; i++) {
      for (const template of ['node', 'base'] as const) {
        const t1 = performance.now();
        const sbx = await Sandbox.create({ template, resources: res, network: false });
        await sbx.commands.run('true');
        const ms = performance.now() - t1;
        await sbx.kill();
        if (i === 0) continue; // the first of each builds or warms what the others reuse
        (template === 'node' ? fromNode : fromBase).push(ms);
      }
    }
    rows.push({ name: 'Sandbox.create from the node template -> first command output', n, unit: 'ms', ...summarize(fromNode), target: 'equal to base within noise' });
    rows.push({ name: '  the same from base', n, unit: 'ms', ...summarize(fromBase) });

    // npm install of the small project, then pause: what the sandbox costs beyond its template.
    const pkg = join(scratch, 'left-pad');
    await writeLeftPad(pkg);
    await publishPackage(registry.url, pkg);
    git = await startGitServer({ repoDir: await makeProjectRepo(join(scratch, 'repos')) });
    const sbx = await Sandbox.create({ template: 'node', resources: res, network: { allowHostLoopback: true } });
    await sbx.commands.run(`git clone ${guestUrl(git.url)} /home/node/project`);
    await sbx.commands.run(`npm install --registry ${guestUrl(registry.url)} --no-audit --no-fund`, { cwd: '/home/node/project', timeoutMs: 300_000 });
    const p = await sbx.pause();
    const info = await Sandbox.getInfo(sbx.sandboxId);
    await Sandbox.kill(sbx.sandboxId);
    rows.push({ name: 'after git clone + npm install + pause: bytes written by the pause', n: 1, unit: 'MiB', value: p.bytes / MiB });
    rows.push({ name: '  bytes on disk of the paused sandbox beyond its template', n: 1, unit: 'MiB', value: info.bytesOnDisk / MiB });
    return {
      rows,
      json: { bench: 'template-image', date: new Date().toISOString(), host: hostname(), node: process.version, measured: true, rows, timings: t, samples: { fromNode, fromBase, ...hostSide.samples } },
    };
  } finally {
    await git?.close().catch(() => undefined);
    await registry.close().catch(() => undefined);
    if (saved === undefined) delete process.env.TORPOR_HOME;
    else process.env.TORPOR_HOME = saved;
    await rm(home, { recursive: true, force: true });
    await rm(scratch, { recursive: true, force: true });
  }
}

/** Import (blobs verified into an empty store) and unpack (flatten + ext4 + agent) of the node image, `runs` times. */
async function measureImport(layout: string, store: string, runs: number): Promise<{ rows: BenchRow[]; samples: Record<string, number[]> }> {
  const importMs: number[] = [];
  const unpackMs: number[] = [];
  const agentDir = join(store, 'agent');
  const agentKey = readdirSync(agentDir).find((d) => /^[0-9a-f]+$/.test(d));
  const agentPath = join(agentDir, agentKey!, 'torpor-agent');
  const agent = { path: agentPath, sha256: await sha256File(agentPath) };
  let bytes = 0;
  for (let i = 0; i < runs; i++) {
    const home = await mkdtemp(join(tmpdir(), 'torpor-bench-import-'));
    try {
      let t0 = performance.now();
      const image = await fetchImage({ ociLayout: layout }, { home });
      importMs.push(performance.now() - t0);
      bytes = image.layers.reduce((a, l) => a + l.size, 0);
      t0 = performance.now();
      await imageRootfs(image, { home, agent });
      unpackMs.push(performance.now() - t0);
    } finally {
      await rm(home, { recursive: true, force: true });
    }
  }
  return {
    rows: [
      { name: `node image (${(bytes / MiB).toFixed(0)} MiB of layers): import into an empty store (digests verified)`, n: runs, unit: 'ms', ...summarize(importMs) },
      { name: '  unpack: layers flattened, mke2fs -d, agent injected (no root)', n: runs, unit: 'ms', ...summarize(unpackMs) },
    ],
    samples: { importMs, unpackMs },
  };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { rows } = await runTemplateImageBench();
  console.log(formatTable(rows));
}
