// A machine's size, in the words the users' posts use (`resources: { cpu, memoryMb, diskMb }`),
// with the older spellings (`vcpus`, `memoryMiB`) kept as aliases. One spelling is reported
// back (getInfo().resources, TemplateInfo.resources): this one.
import { checkInt, checkKnownKeys, checkObject, fail } from '../sandbox/validate.js';

/** A machine's size, as getInfo and TemplateInfo report it. */
export interface Resources {
  /** vCPUs. */
  cpu: number;
  /** Guest RAM in MiB (the posts say "Mb"; it is mebibytes, as memoryMiB always was). */
  memoryMb: number;
  /** Size of the root filesystem's disk in MiB (sparse: free space costs no host disk). */
  diskMb: number;
}

/** A machine's size as create and build take it: each field optional (the default: the template's). */
export type ResourcesOpts = Partial<Resources>;

export const DEFAULT_CPU = 2;
export const DEFAULT_MEMORY_MB = 512;
/** What a new image's root filesystem leaves free by default, beyond the image's content. */
export const DEFAULT_FREE_DISK_MB = 1024;

export function checkResources(what: string, r: unknown): asserts r is ResourcesOpts | undefined {
  checkObject(what, r);
  checkKnownKeys(what, r as object | undefined, ['cpu', 'memoryMb', 'diskMb']);
  const o = (r ?? {}) as Record<string, unknown>;
  checkInt(`${what}.cpu`, o.cpu, 1, 64);
  checkInt(`${what}.memoryMb`, o.memoryMb, 64, 256 * 1024);
  checkInt(`${what}.diskMb`, o.diskMb, 64, 16 * 1024 * 1024);
}

/**
 * One set of sizes from `resources` and the aliases beside it; the two spellings of one size
 * must agree when both are given.
 */
export function mergeResourceAliases(resources: ResourcesOpts | undefined, vcpus: number | undefined, memoryMiB: number | undefined): ResourcesOpts {
  const out: ResourcesOpts = { ...(resources ?? {}) };
  if (vcpus !== undefined) {
    if (out.cpu !== undefined && out.cpu !== vcpus) fail('opts.vcpus', `equal to opts.resources.cpu (${out.cpu}) when both are given`, vcpus);
    out.cpu = vcpus;
  }
  if (memoryMiB !== undefined) {
    if (out.memoryMb !== undefined && out.memoryMb !== memoryMiB) fail('opts.memoryMiB', `equal to opts.resources.memoryMb (${out.memoryMb}) when both are given`, memoryMiB);
    out.memoryMb = memoryMiB;
  }
  return out;
}
