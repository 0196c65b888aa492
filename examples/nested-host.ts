// The examples' way onto a host where Linux cannot boot natively (PVM, or no /dev/kvm at all):
// the same example inside the nested KVM host (an L1 Linux under QEMU's emulator with emulated
// AMD SVM, which needs no /dev/kvm; docs/nested.md), labelled emulated; or one line saying why
// that cannot run either.
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

const checkout = fileURLToPath(new URL('..', import.meta.url));

/** The addon this checkout loads (build/ or prebuilds/), handed to the nested host, which needs one; undefined when none. */
function addonPath(): string | undefined {
  if (process.env.TORPOR_ADDON) return process.env.TORPOR_ADDON;
  try {
    const gypBuild = createRequire(import.meta.url)('node-gyp-build') as { resolve(dir: string): string };
    return gypBuild.resolve(checkout);
  } catch {
    return undefined;
  }
}

/** Why the nested KVM host cannot run here, or null when it can (the L1 kernel is built on demand). */
function nestedBlocker(): string | null {
  if (spawnSync('qemu-system-x86_64', ['--version'], { stdio: 'ignore' }).status !== 0) {
    return 'qemu-system-x86_64 is not installed (apt-get install qemu-system-x86, or `npx torpor setup --install-deps`)';
  }
  if (!addonPath()) return 'the native addon is not built in this checkout (npm install builds it)';
  return null;
}

/** Runs `example` (a path in the checkout) in the nested host; its exit status. */
export function runInNestedHost(host: { kvm: boolean; kind: string }, example: string): number {
  const blocker = nestedBlocker();
  const kvmHere = host.kvm ? `This host's KVM is ${host.kind}` : 'This host has no /dev/kvm (its kernel has no KVM)';
  if (blocker) {
    console.log(
      `No demo on this host: ${kvmHere}, so Linux cannot boot here natively, and the nested KVM host cannot run: ${blocker}. ` +
        'A host with hardware virtualization (VT-x/AMD-V) runs it directly.',
    );
    return 1;
  }
  console.log(`${kvmHere}: Linux guests cannot boot on it natively.`);
  console.log('Running the same demo inside the nested KVM host: an L1 Linux under QEMU\'s emulator with emulated AMD SVM');
  console.log('(EMULATED: the real torpor VMM and Linux guest, but slow; the first run builds L1\'s kernel, ~6 min on 2 cores).\n');
  const r = spawnSync(process.execPath, ['--import', 'tsx', 'test/nested/run.ts', 'node', '--import', 'tsx', example], {
    cwd: checkout,
    env: { ...process.env, TORPOR_ADDON: addonPath() },
    stdio: 'inherit',
  });
  return r.status ?? 1;
}
