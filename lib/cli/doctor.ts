// `torpor doctor`: what this host offers (the native probe), and what setup
// would still need (tools), without building anything.
import { existsSync, readFileSync } from 'node:fs';

import { formatProbe, tryProbeHost } from '../host/probe.js';
import { PVM_KERNEL_NOTE, setupOutlook } from '../setup/artifacts.js';
import { detectHostFromSysfs } from '../setup/host.js';
import { findPasst } from '../net/passt.js';
import { missingPackages } from '../setup/tools.js';
import { homeLayout, torporHome } from '../store/home.js';

/** What a host without /dev/kvm is good for, and what running sandboxes needs. */
const NO_KVM_NOTE = [
  'No KVM on this host: /dev/kvm does not exist (its kernel has no KVM, as in many cloud microVMs), so no sandbox can start here.',
  '  Works here: `torpor setup` (kernel, root filesystem, agent), the guest agent and device tests in `npm test`,',
  '  and, for development, the nested KVM test host: `npm run test:linux` and `npm run demo` run the real VMM',
  "  and Linux guests inside an L1 Linux under QEMU's emulator (slow, no /dev/kvm needed; docs/nested.md).",
  '  To run sandboxes: a Linux host with /dev/kvm and hardware virtualization (VT-x/AMD-V; bare metal, or a VM',
  '  with nested virtualization enabled), or a PVM host with a guest kernel for it (TORPOR_KERNEL).',
].join('\n');

export async function runDoctor(argv: string[]): Promise<number> {
  if (argv.length > 0) {
    process.stderr.write(`torpor doctor takes no arguments\n`);
    return 2;
  }
  let ok = true;
  const out: string[] = [];
  const probed = tryProbeHost();
  if ('probe' in probed) {
    out.push(formatProbe(probed.probe));
    ok = probed.probe.missing.length === 0;
  } else {
    ok = false;
    out.push(formatProbe(probed.error));
    if (probed.error.code === 'ADDON_LOAD_FAILED') {
      // Setup does not need the addon: say what sysfs tells about the host meanwhile.
      const facts = detectHostFromSysfs();
      out.push(`/dev/kvm: ${facts.kvm ? 'present' : 'missing'}; host kind (from sysfs): ${facts.kind}`);
    }
  }

  const layout = homeLayout(torporHome());
  out.push(`TORPOR_HOME: ${layout.root}${existsSync(layout.artifacts) ? '' : ' (nothing built yet: run `torpor setup`)'}`);
  // Where each part will come from, and what the first run will fetch or build before it starts.
  try {
    const outlook = await setupOutlook();
    out.push(`kernel: ${outlook.sources.kernel}`);
    out.push(`agent: ${outlook.sources.agent}`);
    out.push(`base root filesystem: ${outlook.sources.base}`);
    const todo = [...outlook.fetch.map((f) => `fetch ${f}`), ...outlook.build.map((b) => `build the ${b} from source`)];
    out.push(todo.length ? `first run will: ${todo.join('; ')}` : 'first run will: nothing to fetch or build (all stored)');
    if (outlook.blocker) out.push(`setup cannot start: ${outlook.blocker.code}: ${outlook.blocker.message}`);
  } catch (err) {
    out.push(`setup outlook: ${(err as Error).message}`);
  }
  const missing = missingPackages(['agent', 'kernel', 'rootfs']);
  out.push(missing.length ? `tools to build from source missing: apt-get install ${missing.join(' ')}` : 'tools to build from source: all present');
  const passt = findPasst();
  out.push(passt ? `network backend: passt (${passt})` : 'network backend: passt missing: apt-get install passt (sandboxes need it unless created with network: false)');
  const kernel = process.env.TORPOR_KERNEL;
  if (kernel) out.push(`TORPOR_KERNEL: ${kernel}`);
  let record: { kernel?: { source?: string } } = {};
  try {
    record = JSON.parse(readFileSync(layout.setupRecord, 'utf8')) as typeof record;
  } catch {
    // no recorded choice
  }
  if (record.kernel?.source) out.push(`recorded kernel (torpor setup --kernel): ${record.kernel.source}`);
  const facts = detectHostFromSysfs();
  if (!facts.kvm) out.push(NO_KVM_NOTE);
  else if (facts.kind === 'pvm' && !kernel && !record.kernel?.source) out.push(`note: ${PVM_KERNEL_NOTE}`);
  process.stdout.write(out.join('\n') + '\n');
  return ok ? 0 : 1;
}
