// `torpor template build|ls|rm`: the Template API on the command line.
import { parseArgs, type ParseArgsConfig } from 'node:util';

import { InvalidArgumentError } from '../errors.js';
import { Template, type TemplateBuildOpts, type TemplateInfo } from '../template/template.js';
import type { TemplateStep } from '../template/steps.js';

function parse(argv: string[], options: NonNullable<ParseArgsConfig['options']>) {
  try {
    return parseArgs({ args: argv, options, strict: true, allowPositionals: true });
  } catch (err) {
    throw new InvalidArgumentError(`${(err as Error).message} (see torpor --help)`);
  }
}

function int(flag: string, v: unknown): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isInteger(n)) throw new InvalidArgumentError(`--${flag} takes an integer; got ${JSON.stringify(v)}`);
  return n;
}

function kv(flag: string, entries: string[] | undefined): Record<string, string> | undefined {
  if (!entries?.length) return undefined;
  const out: Record<string, string> = {};
  for (const e of entries) {
    const i = e.indexOf('=');
    if (i <= 0) throw new InvalidArgumentError(`--${flag} takes KEY=VALUE; got ${JSON.stringify(e)}`);
    out[e.slice(0, i)] = e.slice(i + 1);
  }
  return out;
}

async function build(argv: string[]): Promise<number> {
  const { values, positionals } = parse(argv, {
    name: { type: 'string' },
    image: { type: 'string' },
    'oci-layout': { type: 'string' },
    'docker-archive': { type: 'string' },
    from: { type: 'string' },
    run: { type: 'string', multiple: true },
    env: { type: 'string', multiple: true },
    workdir: { type: 'string' },
    user: { type: 'string' },
    cpu: { type: 'string' },
    'memory-mb': { type: 'string' },
    'disk-mb': { type: 'string' },
    json: { type: 'boolean', default: false },
  });
  if (positionals.length) throw new InvalidArgumentError(`unexpected argument ${JSON.stringify(positionals[0])} (see torpor --help)`);
  const name = values.name as string | undefined;
  if (!name) throw new InvalidArgumentError('template build needs --name NAME');
  const sources = [values.image, values['oci-layout'], values['docker-archive'], values.from].filter((v) => v !== undefined);
  if (sources.length > 1) throw new InvalidArgumentError('give one of --image, --oci-layout, --docker-archive, --from');
  const from: TemplateBuildOpts['from'] =
    values.image !== undefined
      ? { image: values.image as string }
      : values['oci-layout'] !== undefined
        ? { ociLayout: values['oci-layout'] as string }
        : values['docker-archive'] !== undefined
          ? { dockerArchive: values['docker-archive'] as string }
          : ((values.from as string | undefined) ?? 'base');
  const steps: TemplateStep[] = ((values.run as string[] | undefined) ?? []).map((run) => ({ run }));
  const env = kv('env', values.env as string[] | undefined);
  const resources = {
    ...(int('cpu', values.cpu) !== undefined ? { cpu: int('cpu', values.cpu)! } : {}),
    ...(int('memory-mb', values['memory-mb']) !== undefined ? { memoryMb: int('memory-mb', values['memory-mb'])! } : {}),
    ...(int('disk-mb', values['disk-mb']) !== undefined ? { diskMb: int('disk-mb', values['disk-mb'])! } : {}),
  };
  const json = values.json as boolean;
  let lastDigest = '';
  const info = await Template.build({
    name,
    from,
    steps,
    ...(env ? { env } : {}),
    ...(values.workdir ? { workdir: values.workdir as string } : {}),
    ...(values.user ? { user: values.user as string } : {}),
    ...(Object.keys(resources).length ? { resources } : {}),
    onProgress: (p) => {
      if (json) return;
      if (p.phase === 'download') {
        if (p.cached && p.digest !== lastDigest) process.stderr.write(`  layer ${p.digest.slice(7, 19)} cached\n`);
        else if (p.bytes === p.total) process.stderr.write(`  layer ${p.digest.slice(7, 19)} ${(p.total / 1048576).toFixed(1)} MiB\n`);
        lastDigest = p.digest;
      } else if (p.phase === 'step') {
        if (p.output !== undefined) process.stderr.write(p.output);
        else process.stderr.write(`step ${p.index + 1}/${p.total}: ${p.description}\n`);
      } else if ('message' in p) process.stderr.write(`${p.phase}: ${p.message}\n`);
    },
  });
  if (json) process.stdout.write(JSON.stringify(info, null, 2) + '\n');
  else process.stdout.write(`template ${info.name}: ${info.resources.cpu} vCPUs, ${info.resources.memoryMb} MiB, disk ${info.resources.diskMb} MiB (${((info.timings?.total ?? 0) / 1000).toFixed(1)} s)\n`);
  return 0;
}

function row(t: TemplateInfo): string {
  const from = t.kind === 'automatic' ? '(automatic)' : typeof t.from === 'string' ? t.from : t.from && 'image' in t.from ? t.from.image : t.image?.source ?? '';
  return [t.name, from, `${t.resources.cpu}`, `${t.resources.memoryMb}`, `${t.resources.diskMb}`, `${t.dependents.length}`, t.createdAt.toISOString()].join('\t');
}

async function list(argv: string[]): Promise<number> {
  const { values } = parse(argv, { json: { type: 'boolean', default: false } });
  const all = await Template.list();
  if (values.json) process.stdout.write(JSON.stringify(all, null, 2) + '\n');
  else process.stdout.write(['NAME\tFROM\tCPU\tMEMORY_MB\tDISK_MB\tUSED_BY\tCREATED', ...all.map(row)].join('\n') + '\n');
  return 0;
}

async function remove(argv: string[]): Promise<number> {
  const { values, positionals } = parse(argv, { force: { type: 'boolean', default: false } });
  if (positionals.length !== 1) throw new InvalidArgumentError('template rm takes one NAME');
  await Template.remove(positionals[0]!, { force: values.force as boolean });
  return 0;
}

export async function runTemplate(argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  switch (sub) {
    case 'build':
      return build(rest);
    case 'ls':
    case 'list':
      return list(rest);
    case 'rm':
    case 'remove':
      return remove(rest);
    default:
      throw new InvalidArgumentError(`torpor template takes build, ls or rm; got ${JSON.stringify(sub ?? '')}`);
  }
}
