// The benchmark families as docs/benchmarks.md shows them: what each measures, how to run it
// again, and its figures read from bench/results/<file>.json (each bench writes its own shape;
// every figure shown is one the JSON holds).
import { type BenchRow, summarize } from '../report.js';

/** One row of a family's table. `value` is the p50 where the bench gave a distribution. */
export type Figure = Omit<BenchRow, 'n'> & { n?: number };

export interface Family {
  id: string;
  title: string;
  file: string;
  what: string;
  rerun: string;
  date: string;
  machine: string;
  /** The machine without the run's load: what the README groups figures by. */
  host: string;
  figures: Figure[];
  /** Extra lines under the table (context the JSON gives: where it ran, what was not measured). */
  notes: string[];
  /** Samples over time, for a line chart instead of bars (the soak). */
  series?: { t: number[]; lines: Array<{ name: string; unit: string; values: number[] }> };
}

type Json = Record<string, unknown>;

const str = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined);

const KVM_KINDS: Record<string, string> = {
  pvm: 'PVM host (KVM without hardware virtualization)',
  vmx: 'hardware virtualization (Intel VT-x)',
  svm: 'hardware virtualization (AMD-V)',
  hardware: 'hardware virtualization',
  none: 'no /dev/kvm',
};

/** The machine a result was measured on, as the JSON records it; never guessed. */
export function machineOf(json: Json, withLoad = true): string {
  const m = json.machine as Json | undefined;
  if (m && typeof m === 'object') {
    const kvm = KVM_KINDS[str(m.kvm) ?? ''] ?? 'KVM kind not recorded';
    const load = withLoad && Array.isArray(m.loadAverage) ? `, load average ${m.loadAverage[0]} -> ${m.loadAverage[1]}` : '';
    const home = m.home as Json | undefined;
    const fs = home && str(home.type) ? `, TORPOR_HOME on ${str(home.type)}${home.journal === false ? ' without a journal' : home.journal === true ? ' with a journal' : ''}` : '';
    return `${str(m.cpu) ?? 'unknown CPU'}, ${m.cores} cores, ${m.memoryGiB} GiB, Linux ${str(m.kernel) ?? '?'}, ${kvm}${fs}, Node ${str(m.node) ?? '?'}${load}`;
  }
  const parts: string[] = [];
  // Older benches wrote `host`: a kernel line (x64 ...) or a bare hostname ('vm' says nothing).
  const host = str(json.host);
  if (host && host !== 'vm') parts.push(/\s/.test(host) ? host : `host "${host}" (no more recorded)`);
  if (json.hostKind === 'pvm') parts.push('PVM host (KVM without hardware virtualization)');
  else if (json.hostKind === 'hardware') parts.push('hardware virtualization');
  if (str(json.where)) parts.push(str(json.where)!);
  if (str(json.node) && parts.length) parts.push(`Node ${str(json.node)}`);
  return parts.length ? parts.join(', ') : 'machine not recorded';
}

export function rowFigure(r: BenchRow): Figure {
  const f: Figure = { name: r.name.trim(), unit: r.unit };
  if (r.n !== undefined) f.n = r.n;
  if (r.p50 !== undefined) f.p50 = r.p50;
  if (r.p99 !== undefined) f.p99 = r.p99;
  if (r.mean !== undefined) f.mean = r.mean;
  if (r.value !== undefined) f.value = r.value;
  if (r.target !== undefined) f.target = r.target;
  if (r.meetsTarget !== undefined) f.meetsTarget = r.meetsTarget;
  if (r.note !== undefined) f.note = r.note;
  return f;
}

interface Spec {
  id: string;
  title: string;
  what: string;
  rerun: string;
  figures?: (json: Json) => Figure[];
  notes?: (json: Json) => string[];
  series?: (json: Json) => Family['series'];
}

const rows = (json: Json): Figure[] => ((json.rows as BenchRow[] | undefined) ?? []).filter((r) => r.n !== 0).map(rowFigure);
/** A figure from raw samples the JSON holds (p50 and mean by bench/report.ts's summarize). */
function sampled(name: string, unit: string, xs: number[], extra: Partial<Figure> = {}): Figure {
  const { p50, mean } = summarize(xs);
  return { name, unit, n: xs.length, p50, mean, ...extra };
}

export const SPECS: Spec[] = [
  {
    id: 'template',
    title: 'Sandboxes from a warm template',
    what: 'The test guest standing in for Linux: the template the first create builds, `Sandbox.create` from it to the first agent answer against a cold boot, and what the first pause of a template sandbox writes.',
    rerun: 'npm run bench -- template',
  },
  {
    id: 'pause',
    title: 'Pause and connect',
    what: '`sbx.pause()` after 16 MiB dirtied (captured, durable, the whole call) and `Sandbox.connect` in this process and in a new one, with the test guest; and the bytes a paused Linux sandbox takes beyond its template (measured in the nested host, where byte counts are valid).',
    rerun: 'npm run bench -- pause',
    figures: (json) => [...rows(json), ...(((json.linuxDisk as Json | undefined)?.rows as BenchRow[] | undefined) ?? []).map(rowFigure)],
    notes: (json) => {
      const disk = json.linuxDisk as Json | undefined;
      return disk ? [`The Linux disk row: ${str(disk.where) ?? 'where not recorded'} (${str(disk.date)?.slice(0, 10) ?? 'date not recorded'}).`] : [];
    },
  },
  {
    id: 'fork',
    title: 'Fork and checkpoints',
    what: '`sbx.fork(10)` of a test-guest sandbox (64 MiB) against `machine.fork(10)` of the same guest in the same run, with and without a network; `sbx.checkpoint()` and `sbx.restore()` of a running sandbox.',
    rerun: 'npm run bench -- fork',
  },
  {
    id: 'sandbox-dir',
    title: "A new sandbox's directory (no KVM)",
    what: "What each create and each fork's child pays on disk around its guest's start: the directory, the owner lock and `meta.json`, each write durable (`starting` then `running` for a create; `running` only for a fork's child), for one sandbox and for ten children at once (a fork of 10's share).",
    rerun: 'npm run bench -- sandbox-dir',
  },
  {
    id: 'snapshot',
    title: 'Machine snapshots (VMM level)',
    what: 'Captures of a running test guest with a given number of pages written (captured: the machine stopped; durable: written and fsynced), restores, `machine.fork(10)`, and QEMU saving and restoring the same guest in the same run.',
    rerun: 'npm run bench -- snapshot',
  },
  {
    id: 'vmm',
    title: 'The VMM',
    what: 'Machine create to the first guest output, exit round trips, pause and resume of vCPUs, virtio-blk from the test guest.',
    rerun: 'npm run bench -- vmm',
  },
  {
    id: 'agent',
    title: 'The guest agent',
    what: 'Protocol round trips, `commands.run` and file transfer against the agent run as a host process (a Unix socket), and PING over vsock to the test guest.',
    rerun: 'npm run bench -- agent',
  },
  {
    id: 'sandbox',
    title: 'Sandbox create and kill (booted)',
    what: '`Sandbox.create` booting the test guest (no template) to the agent\'s HELLO, and `kill()`.',
    rerun: 'npm run bench -- sandbox',
  },
  {
    id: 'net-pause',
    title: 'Pause and connect with a network',
    what: '`sbx.pause()` and `Sandbox.connect()` of a test-guest sandbox without a network, with passt, and with a forwarded port.',
    rerun: 'npm run bench -- net-pause',
  },
  {
    id: 'net',
    title: 'The network backend',
    what: 'passt as the user-mode network: its start, an ARP round trip and its memory per sandbox (p50 and mean over the instances), libslirp in-process for comparison, and the virtio-net device\'s throughput against fake guest memory.',
    rerun: 'npm run bench -- net',
    // The stored net.json predates the bench's rows: its raw samples are summarized here.
    figures: (json) => {
      if (Array.isArray(json.rows)) return rows(json);
      const starts = (json.startsMs as number[] | undefined) ?? [];
      const arp = (json.arpUs as number[] | undefined) ?? [];
      const mem = (json.passtMemoryKiB as Array<{ pss: number }> | undefined) ?? [];
      const slirp = json.slirp as { instances: number; create_us_each: number; arp_us_each: number; rss_kib_each: number } | undefined;
      const out: Figure[] = [];
      if (starts.length) out.push(sampled('passt start (spawn to ready)', 'ms', starts));
      if (arp.length) out.push(sampled('ARP round trip through passt', 'us', arp));
      if (mem.length) out.push(sampled('passt memory per sandbox (PSS)', 'KiB', mem.map((m) => m.pss), { target: '< 5 MiB' }));
      if (slirp) {
        out.push({ name: 'reference: libslirp (in-process): create', unit: 'us', n: slirp.instances, value: slirp.create_us_each });
        out.push({ name: 'reference: libslirp (in-process): ARP answered', unit: 'us', n: slirp.instances, value: slirp.arp_us_each });
        out.push({ name: 'reference: libslirp (in-process): memory each', unit: 'KiB', n: slirp.instances, value: slirp.rss_kib_each });
      }
      return out;
    },
    notes: (json) => (str(json.device) ? ['The device\'s throughput, as the bench printed it:', '', '```text', str(json.device)!.trimEnd(), '```'] : []),
  },
  {
    id: 'template-image',
    title: 'Templates from container images (host side)',
    what: 'A container image imported into an empty store (digests verified) and unpacked into an ext4 root filesystem with the agent, without root.',
    rerun: 'npm run bench -- template-image',
    notes: (json) => (json.measured === 'host-side only' && str(json.reason) ? [`Only the host side was measured: ${str(json.reason)}`] : []),
  },
  {
    id: 'seccomp',
    title: 'Seccomp on the vCPU threads',
    what: 'Exit round trips with the per-thread seccomp filters off and on (median of rounds).',
    rerun: 'npx tsx bench/seccomp.ts',
    figures: (json) =>
      ((json.rows as Array<{ exit: string; off_us: number; on_us: number; rounds: number }> | undefined) ?? []).flatMap((r) => [
        { name: `${r.exit.toUpperCase()} exit round trip, seccomp off`, unit: 'us', n: r.rounds, value: r.off_us },
        { name: `${r.exit.toUpperCase()} exit round trip, seccomp on`, unit: 'us', n: r.rounds, value: r.on_us },
      ]),
  },
  {
    id: 'soak-3600',
    title: 'Soak: an hour of captures',
    what: 'Test-guest machines in one process looping on vsock echoes, block writes and pause-capture-restore cycles; fds, threads, RSS and disk sampled throughout. The judge compares the first and the last merge period\'s peaks against its limits.',
    rerun: 'node --import tsx bench/soak.ts --machines 20 --seconds 3600 --sample 30 --json bench/results/soak-3600.json',
    figures: (json) => {
      const checks = (json.checks as Record<string, { warm: number; end: number; limit: number }> | undefined) ?? {};
      return Object.entries(checks).map(([k, c]) => ({ name: `${k}: first period's peak -> last period's peak (limit)`, unit: '', value: c.end, note: `${c.warm} -> ${c.end} (limit ${c.limit})` }));
    },
    notes: (json) => {
      const s = (json.samples as Array<{ captures: number; errors: number }> | undefined) ?? [];
      const last = s[s.length - 1];
      const failures = (json.failures as string[] | undefined) ?? [];
      return [`${json.machines} machines for ${json.seconds} s, a capture every ${json.captureEverySeconds} s: ${last?.captures ?? '?'} captures, ${last?.errors ?? '?'} errors; ${failures.length ? `failed: ${failures.join('; ')}` : 'judged flat'}.`];
    },
    series: (json) => {
      const s = (json.samples as Array<Record<string, number>> | undefined) ?? [];
      return {
        t: s.map((x) => x.t!),
        lines: [
          { name: 'fds', unit: '', values: s.map((x) => x.fds!) },
          { name: 'RSS', unit: 'MiB', values: s.map((x) => x.rssMiB!) },
          { name: 'disk', unit: 'MiB', values: s.map((x) => x.diskMiB!) },
        ],
      };
    },
  },
];

/** A family from its JSON (the file's name is the spec's id). */
export function familyOf(spec: Spec, json: Json): Family {
  const fam: Family = {
    id: spec.id,
    title: spec.title,
    file: `bench/results/${spec.id}.json`,
    what: spec.what,
    rerun: spec.rerun,
    date: str(json.date)?.slice(0, 10) ?? 'date not recorded',
    machine: machineOf(json),
    host: machineOf(json, false),
    figures: (spec.figures ?? rows)(json),
    notes: spec.notes?.(json) ?? [],
  };
  const series = spec.series?.(json);
  if (series) fam.series = series;
  return fam;
}
