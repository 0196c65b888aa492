// `torpor setup`: build what is missing, report each phase, print the paths.
import { parseArgs } from 'node:util';

import { InvalidArgumentError } from '../errors.js';
import { ensureArtifacts } from '../setup/artifacts.js';
import { installCommands, missingDebianPackages, runInstall } from '../setup/deps.js';
import { streamProgress } from '../setup/progress.js';

export async function runSetup(argv: string[]): Promise<number> {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        kernel: { type: 'string' },
        'own-kernel': { type: 'boolean', default: false },
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
  if (values['dry-run'] && !values['install-deps']) {
    throw new InvalidArgumentError('--dry-run goes with --install-deps');
  }
  if (values['install-deps']) {
    // The missing ones from deps/debian-packages.txt, installed before anything builds.
    const missing = missingDebianPackages();
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
  const report = await ensureArtifacts({
    kernel: values.kernel,
    recordKernel: values.kernel !== undefined,
    forgetKernel: values['own-kernel'],
    verify: values.verify,
    onProgress: streamProgress(process.stderr),
  });
  for (const note of report.notes) process.stderr.write(`note: ${note}\n`);
  const seconds = ((Date.now() - started) / 1000).toFixed(2);
  if (values.json) {
    const { kernel, rootfs, agent, host } = report;
    process.stdout.write(JSON.stringify({ kernel, rootfs, agent, host }, null, 2) + '\n');
  } else {
    const what = report.built.length ? `built ${report.built.join(', ')}` : 'nothing to build';
    process.stdout.write(
      `kernel  ${report.kernel} (${report.kernelOrigin}, ${report.kernelFormat})\n` +
        `rootfs  ${report.rootfs}\n` +
        `agent   ${report.agent}\n` +
        `host    ${report.host}${report.linuxBootable ? '' : ' (Linux guests need TORPOR_KERNEL here; see the note above)'}\n` +
        `setup: ${what} in ${seconds} s\n`,
    );
  }
  return 0;
}
