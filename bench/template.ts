// Sandbox.create from a warm template (lib/sandbox/template.ts) with guest/testvm standing in for
// Linux, so it runs on every KVM host: create -> the agent's first answer (an ECHO, the test
// guest's "first command output"), beside a cold boot (template: false); and what a sandbox
// from the template takes after a small disk write + pause (the test guest's `echo hi > f`:
// one sector written, the agent's SYNC, the capture). The Linux figures of docs/architecture.md#performance-targets (create ->
// first output p50 <= 10 ms; <= 8 MiB beyond the template) need a Linux guest: bytes are valid in
// the nested host (test/sandbox-linux-template.test.ts prints them), timings only on hardware.
//
// Runs in a temporary TORPOR_HOME whose artifacts/ links to the real store (the template is
// built there, not in the user's home).
import { mkdtempSync } from 'node:fs';
import { rm, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { FieldWriter } from '../lib/agent/fields.js';
import { FrameType } from '../lib/agent/protocol.js';
import type { AgentClient } from '../lib/agent/client.js';
import { baseIsCached } from '../lib/setup/rootfs.js';
import { Sandbox } from '../lib/sandbox/sandbox.js';
import { homeLayout } from '../lib/store/home.js';
import type { Machine } from '../lib/vm/machine.js';
import { testvmCommand, testvmImage } from '../test/vmm-guests.js';
import { type BenchRow, formatTable, percentile, summarize } from './report.js';

const internals = (sbx: Sandbox) => sbx as unknown as { client: AgentClient; machine: Machine };
const echo = (sbx: Sandbox) => internals(sbx).client.call(FrameType.ECHO, new FieldWriter().bytes('data', Buffer.from('x')));
const KiB = 1024;

export async function runTemplateBench(opts: { iterations?: number; memoryMiB?: number } = {}): Promise<{ rows: BenchRow[]; json: unknown }> {
  const n = opts.iterations ?? 20;
  const memoryMiB = opts.memoryMiB ?? 512;
  const kernel = testvmImage();
  const rows: BenchRow[] = [];
  const store = homeLayout().artifacts;
  if (!kernel || !(await baseIsCached(store, false))) {
    rows.push({ name: 'Sandbox.create from a template (test guest)', n: 0, unit: 'ms', note: 'skipped: needs guest/testvm built and the root filesystem stored (torpor setup)' });
    return { rows, json: { bench: 'template', date: new Date().toISOString(), rows } };
  }
  const saved = process.env.TORPOR_HOME;
  const home = mkdtempSync(join(tmpdir(), 'torpor-bench-template-'));
  await symlink(store, join(home, 'artifacts'));
  process.env.TORPOR_HOME = home;
  const base = { vcpus: 1, memoryMiB, boot: { kernel, cmdlineExtra: 'testvm.agent_ready=1', timeoutMs: 15_000 } };
  try {
    // The first create builds the template (a boot and a full capture); timed on its own.
    const t0 = performance.now();
    await (await Sandbox.create(base)).kill();
    const buildMs = performance.now() - t0;
    const warm: number[] = [];
    const cold: number[] = [];
    for (let i = 0; i < n + 1; i++) {
      // Interleaved: from the template, and booted (template: false).
      for (const template of [undefined, false] as const) {
        const t1 = performance.now();
        const sbx = await Sandbox.create({ ...base, ...(template === false ? { template } : {}) });
        await echo(sbx);
        const ms = performance.now() - t1;
        await sbx.kill();
        if (i === 0) continue;
        (template === false ? cold : warm).push(ms);
      }
    }
    const sorted = [...warm].sort((a, b) => a - b);
    rows.push({ name: `template built by the first create (boot, SYNC, full capture; ${memoryMiB} MiB)`, n: 1, unit: 'ms', value: buildMs });
    rows.push({
      name: `Sandbox.create from the template -> first agent answer (${memoryMiB} MiB)`,
      n,
      unit: 'ms',
      ...summarize(warm),
      note: `p95 ${percentile(sorted, 95).toFixed(1)} ms; restore into the sandbox's directory, passt, rendezvous, RESUMED`,
      target: '<= 10 ms p50 (Linux, hardware host)',
    });
    rows.push({ name: '  the same booted (template: false)', n, unit: 'ms', ...summarize(cold) });

    // The test guest's `echo hi > f`: one sector written, then pause (SYNC, capture).
    const written: number[] = [];
    const onDisk: number[] = [];
    for (let i = 0; i < Math.min(n, 5); i++) {
      const sbx = await Sandbox.create(base);
      try {
        await testvmCommand(internals(sbx).machine, `blk-write ${4096 + i} 7 1`, 'blk-write');
        const r = await sbx.pause();
        written.push(r.bytes / KiB);
        onDisk.push((await Sandbox.getInfo(sbx.sandboxId)).bytesOnDisk / KiB);
      } finally {
        await Sandbox.kill(sbx.sandboxId).catch(() => undefined);
      }
    }
    rows.push({ name: 'first pause of a template sandbox after one sector written: bytes written', n: written.length, unit: 'KiB', ...summarize(written) });
    rows.push({ name: '  bytes on disk of the paused sandbox beyond its template', n: onDisk.length, unit: 'KiB', ...summarize(onDisk), target: '<= 8 MiB (Linux, echo hi > f)' });
    return {
      rows,
      json: { bench: 'template', date: new Date().toISOString(), node: process.version, memoryMiB, rows, samples: { warm, cold, writtenKiB: written, onDiskKiB: onDisk } },
    };
  } finally {
    if (saved === undefined) delete process.env.TORPOR_HOME;
    else process.env.TORPOR_HOME = saved;
    await rm(home, { recursive: true, force: true });
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { rows } = await runTemplateBench();
  console.log(formatTable(rows));
}
