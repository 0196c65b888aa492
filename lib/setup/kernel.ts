// The kernel phase: our own vmlinux built from guest/kernel/, or a kernel the
// user supplies (TORPOR_KERNEL / --kernel), checked and copied into the store.
import { existsSync } from 'node:fs';
import { copyFile, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';

import { TorporError } from '../errors.js';
import { ensureArtifact, type ArtifactResult, type ArtifactSpec } from '../store/artifact.js';
import { sha256File } from '../store/hash.js';
import { commandOutput, debianVersion } from './host-info.js';
import { inspectKernel, type KernelInfo } from './kernel-format.js';
import { kernelDir } from './paths.js';
import type { ProgressSink } from './progress.js';
import { runScript } from './run-script.js';
import { LINUX_SOURCE_TARBALL } from './tools.js';

/**
 * Compile steps (CC/AS/LD/AR lines) a build of our config prints; measured on
 * Linux 6.1.192 with guest/kernel/torpor.config. Only used to estimate a percentage.
 */
const EXPECTED_BUILD_STEPS = 1330;

export interface KernelArtifact {
  path: string;
  info: KernelInfo;
  /** 'built': ours, from guest/kernel; 'package': ours, prebuilt (lib/setup/kernel-package.ts);
   *  'supplied': the user's, copied into the store. */
  origin: 'built' | 'package' | 'supplied';
  sha256: string;
  artifact: ArtifactResult;
}

/**
 * Another kernel built by the same machinery from torpor.config plus a fragment
 * (the nested test host's L1 kernel: test/nested/l1.config). A symbol the
 * fragment sets replaces its line in torpor.config, so verify-config.sh checks
 * the merged file and every requested option must survive.
 */
export interface KernelVariant {
  /** artifacts/<kind>/ (e.g. kernel-l1). */
  kind: string;
  /** Path of the extra fragment. */
  fragment: string;
  /** For messages: 'the nested host's L1 kernel'. */
  what: string;
  /** Wrap build.sh (e.g. ['nice', '-n', '10']) to keep a shared machine usable. */
  wrapper?: string[];
}

const CONFIG_SYMBOL = /^(?:(CONFIG_[A-Za-z0-9_]+)=|# (CONFIG_[A-Za-z0-9_]+) is not set$)/;

/** torpor.config with the fragment's symbols replaced by the fragment's lines. */
export function mergeKernelFragments(base: string, extra: string): string {
  const symbol = (line: string): string | undefined => {
    const m = CONFIG_SYMBOL.exec(line);
    return m ? (m[1] ?? m[2]) : undefined;
  };
  const overridden = new Set(extra.split('\n').map(symbol).filter((s): s is string => s !== undefined));
  const kept = base.split('\n').filter((line) => {
    const s = symbol(line);
    return s === undefined || !overridden.has(s);
  });
  return `${kept.join('\n')}\n${extra}`;
}

/** The key inputs and build of our own kernel (or of a variant of it). */
export async function builtKernelSpec(onProgress?: ProgressSink, variant?: KernelVariant): Promise<ArtifactSpec> {
  const [config, script, verify, sourceVersion, compiler, fragment] = await Promise.all([
    readFile(join(kernelDir, 'torpor.config')),
    readFile(join(kernelDir, 'build.sh')),
    readFile(join(kernelDir, 'verify-config.sh')),
    debianVersion('linux-source-6.1'),
    commandOutput('gcc', ['-dumpfullversion']),
    variant ? readFile(variant.fragment) : undefined,
  ]);
  const started = Date.now();
  const inputs: Record<string, string | Uint8Array> = {
    'torpor.config': config,
    'build.sh': script,
    'verify-config.sh': verify,
    'linux-source-6.1': sourceVersion,
    gcc: compiler,
  };
  // Only for a variant, so the guest kernel's key stays what it was.
  if (fragment) inputs.fragment = fragment;
  // Another source tarball is another kernel: the package version above says
  // nothing about it. (Only when set, so the usual key stays what it was.)
  const tarball = process.env.LINUX_SOURCE_TARBALL;
  if (tarball) {
    const st = await stat(tarball).catch(() => undefined);
    inputs['linux-source-tarball'] = st ? `${tarball} ${st.size} ${st.mtimeMs} ${st.ino}` : `${tarball} missing`;
  }
  const what = variant?.what ?? 'the guest kernel';
  return {
    kind: variant?.kind ?? 'kernel',
    inputs,
    files: ['vmlinux', 'config'],
    build: async (dir) => {
      let steps = 0;
      const log: string[] = [];
      onProgress?.({ phase: 'kernel', status: 'start', message: `building ${what}: Linux ${sourceVersion} (several minutes)`, elapsedMs: 0 });
      // build.sh applies the torpor.config beside it: a variant gets a staged
      // copy of the scripts with the merged fragment under that name.
      let scriptDir = kernelDir;
      let staged: string | undefined;
      if (fragment) {
        staged = await mkdtemp(join(tmpdir(), `torpor-${variant!.kind}-`));
        await writeFile(join(staged, 'build.sh'), script, { mode: 0o755 });
        await writeFile(join(staged, 'verify-config.sh'), verify, { mode: 0o755 });
        await writeFile(join(staged, 'torpor.config'), mergeKernelFragments(config.toString(), fragment.toString()));
        scriptDir = staged;
      }
      const wrapper = variant?.wrapper ?? [];
      const command = [...wrapper, join(scriptDir, 'build.sh'), dir];
      try {
        await runScript(command[0]!, command.slice(1), {
          what: `building ${what}`,
          env: { ...process.env, ...compilerCacheEnv(dir), LINUX_SOURCE_TARBALL: process.env.LINUX_SOURCE_TARBALL ?? LINUX_SOURCE_TARBALL },
          log: (line) => log.push(line),
          onLine: (line) => {
            const phase = /^phase: (\S+)/.exec(line);
            if (/^\s+(CC|AS|LD|AR)\s/.test(line)) steps++;
            else if (!phase) return;
            onProgress?.({
              phase: 'kernel',
              status: 'step',
              percent: Math.min(99, (steps * 100) / EXPECTED_BUILD_STEPS),
              message: phase ? phase[1] : 'compile',
              elapsedMs: Date.now() - started,
            });
          },
        });
      } finally {
        if (staged) await rm(staged, { recursive: true, force: true });
      }
      await writeFile(join(dir, 'build.log'), log.join('\n') + '\n');
    },
  };
}

/**
 * A user-supplied kernel: validated, then copied into the store keyed by its
 * content hash (so editing the file later cannot change what a template booted).
 * `known` (from setup.json) skips re-reading the source when the stored copy is intact.
 */
export async function suppliedKernel(
  path: string,
  root: string,
  verify: boolean,
  known?: { sha256: string; format: KernelInfo['format'] },
): Promise<KernelArtifact> {
  const info: KernelInfo = known ? { format: known.format, size: 0 } : await inspectKernel(path);
  const hash = known ? known.sha256 : await sha256File(path);
  const name = info.format === 'bzimage' ? 'bzImage' : 'vmlinux';
  const artifact = await ensureArtifact(
    {
      kind: 'kernel-supplied',
      inputs: { content: hash },
      files: [name],
      build: async (dir) => {
        if (known) await inspectKernel(path);
        await copyFile(path, join(dir, name));
        if ((await sha256File(join(dir, name))) !== hash) {
          throw new TorporError('KERNEL_INVALID', `${path} changed since it was checked; run \`torpor setup --kernel ${path}\` again`);
        }
        // Check the copy, not only the source: the source may have been swapped between
        // its check and its hash, and the copy is what machines will boot.
        const stored = await inspectKernel(join(dir, name));
        if (stored.format !== info.format) {
          throw new TorporError('KERNEL_INVALID', `${path} changed since it was checked; run \`torpor setup --kernel ${path}\` again`);
        }
      },
    },
    { root, verify },
  );
  info.size = artifact.manifest.files[name]!.size;
  return { path: join(artifact.dir, name), info, origin: 'supplied', sha256: hash, artifact };
}

export async function builtKernel(root: string, verify: boolean, onProgress?: ProgressSink, spec?: ArtifactSpec): Promise<KernelArtifact> {
  spec ??= await builtKernelSpec(onProgress);
  const artifact = await ensureArtifact(spec, {
    root,
    verify,
    onWait: (pid) =>
      onProgress?.({ phase: 'kernel', status: 'note', message: `waiting for another build (pid ${pid ?? '?'})`, elapsedMs: 0 }),
    onDamaged: (_dir, reason) =>
      onProgress?.({ phase: 'kernel', status: 'note', message: `stored kernel is damaged (${reason}); rebuilding`, elapsedMs: 0 }),
  });
  const path = join(artifact.dir, 'vmlinux');
  // Cheap (one read of the notes) and guards against a build that produced the wrong thing.
  const info = artifact.built ? await inspectKernel(path) : { format: 'elf-pvh' as const, size: artifact.manifest.files.vmlinux!.size };
  if (info.format !== 'elf-pvh') {
    throw new TorporError('KERNEL_INVALID', `the kernel built from guest/kernel has no PVH note (${info.format}); check CONFIG_PVH`);
  }
  return { path, info, origin: 'built', sha256: artifact.manifest.files.vmlinux!.sha256, artifact };
}

/** Debian's ccache masquerade directory: `gcc` there is ccache in front of the real gcc. */
const CCACHE_MASQUERADE = '/usr/lib/ccache';

/**
 * The environment that puts ccache in front of gcc for a kernel build, when ccache is installed
 * (deps/debian-packages.txt lists it; nothing requires it) and TORPOR_CCACHE is not '0'. A kernel
 * takes 10-20 minutes on 2 cores; rebuilding one whose sources and config were compiled before
 * (a fresh TORPOR_HOME, as CI's fresh-clone run uses, or a store entry rebuilt after damage) takes
 * a few. The output is the same vmlinux, so the artifact's key does not mention the cache. Each
 * build unpacks the source under its own store directory: base_dir makes those paths relative, so
 * builds in different directories share entries; the sloppiness is for the headers kbuild
 * generates during the build (their contents are still hashed).
 */
export function compilerCacheEnv(buildDir: string, env: NodeJS.ProcessEnv = process.env): NodeJS.ProcessEnv {
  if (env.TORPOR_CCACHE === '0' || !existsSync(join(CCACHE_MASQUERADE, 'gcc'))) return {};
  return {
    PATH: `${CCACHE_MASQUERADE}${delimiter}${env.PATH ?? ''}`,
    CCACHE_BASEDIR: buildDir,
    CCACHE_NOHASHDIR: '1',
    CCACHE_SLOPPINESS: 'time_macros,include_file_mtime,include_file_ctime',
  };
}
