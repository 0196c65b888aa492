// `torpor setup`: build what is missing, report each phase, print the paths.
import { parseArgs } from 'node:util';

import { InvalidArgumentError } from '../errors.js';
import { ensureArtifacts, setupOutlook } from '../setup/artifacts.js';
import { installCommands, missingDebianPackages, runInstall } from '../setup/deps.js';
import { streamProgress } from '../setup/progress.js';
import { missingPackages } from '../setup/tools.js';

export async function runSetup(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        kernel: { type: 'string' },
        'own-kernel': { type: 'boolean', default: false },
        'base-image': { type: 'string' },
        'debian-base': { type: 'boolean', default: false },
        json: { type: 'boolean', default: false },
        verify: { type: 'boolean', default: false },
        'install-deps': { type: 'boolean', default: false },
        'dry-run': { type: 'boolean', default: false },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (err) {
    throw new InvalidArgumentError(`${(err as Error).message} (see torpor --help)`);
  }
  if (values.kernel !== undefined && values['own-kernel']) {
    throw new InvalidArgumentError('--kernel and --own-kernel exclude each other');
  }
  if (values['base-image'] !== undefined && values['debian-base']) {
    throw new InvalidArgumentError('--base-image and --debian-base exclude each other');
  }
  if (values['dry-run'] && !values['install-deps']) {
    throw new InvalidArgumentError('--dry-run goes with --install-deps');
  }
  const setupOptions = {
    kernel: values.kernel,
    recordKernel: values.kernel !== undefined,
    forgetKernel: values['own-kernel'],
    // A base image given here or in TORPOR_BASE_IMAGE is remembered: Sandbox.create later uses it too.
    baseImage: values['base-image'],
    recordBaseImage: !values['debian-base'],
    forgetBaseImage: values['debian-base'],
    verify: values.verify,
  };
  if (values['install-deps']) {
    // The missing ones from the user's list (deps/debian-packages.txt), and those a build from
    // source needs (deps/debian-packages-dev.txt) when this setup will build one, installed
    // before anything builds.
    const outlook = await setupOutlook(setupOptions);
    const missing = [...new Set([...missingDebianPackages(), ...missingPackages(outlook.tools)])];
    const asRoot = typeof process.getuid === 'function' && process.getuid() === 0;
    const commands = installCommands(missing, asRoot);
    if (values['dry-run']) {
      process.stdout.write(commands.map((argv) => argv.join(' ') + '\n').join('') || 'setup: no Debian packages missing\n');
      return 0;
    }
    if (commands.length === 0) {
      process.stderr.write('setup: no Debian packages missing\n');
    } else {
      process.stderr.write(
        `setup: installing ${missing.length} missing Debian package${missing.length === 1 ? '' : 's'}: ${missing.join(' ')}` +
          `${asRoot ? '' : ' (not root: through sudo, which may ask for your password)'}\n`,
      );
      runInstall(commands);
    }
  }
  const started = Date.now();
  // Progress goes to stderr so --json leaves stdout machine-readable.
  const report = await ensureArtifacts({ ...setupOptions, onProgress: streamProgress(process.stderr) });
  for (const note of report.notes) process.stderr.write(`note: ${note}\n`);
  const seconds = ((Date.now() - started) / 1000).toFixed(2);
  if (values.json) {
    const { kernel, rootfs, agent, host, kernelOrigin, baseSource, built, fetched, sources } = report;
    process.stdout.write(JSON.stringify({ kernel, rootfs, agent, host, kernelOrigin, baseSource, built, fetched, sources, seconds: Number(seconds) }, null, 2) + '\n');
  } else {
    const what =
      [report.built.length ? `built ${report.built.join(', ')} from source` : '', report.fetched.length ? `fetched ${report.fetched.join(', ')}` : '']
        .filter(Boolean)
        .join('; ') || 'nothing to build or fetch';
    process.stdout.write(
      `kernel  ${report.kernel} (${report.kernelOrigin}, ${report.kernelFormat})\n` +
        `rootfs  ${report.rootfs} (${report.baseSource === 'debian' ? 'Debian packages' : `image ${report.baseSource}`})\n` +
        `agent   ${report.agent}\n` +
        `host    ${report.host}${report.linuxBootable ? '' : ' (Linux guests need TORPOR_KERNEL here; see the note above)'}\n` +
        `setup: ${what} in ${seconds} s\n`,
    );
  }
  return 0;
}
