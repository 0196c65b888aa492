// `torpor doctor`: what this host offers (the native probe), and what setup
// would still need (tools), without building anything.
import { existsSync, readFileSync } from 'node:fs';

import { formatProbe, tryProbeHost } from '../host/probe.js';
import { PVM_KERNEL_NOTE } from '../setup/artifacts.js';
import { detectHostFromSysfs } from '../setup/host.js';
import { findPasst } from '../net/passt.js';
import { missingPackages } from '../setup/tools.js';
import { homeLayout, torporHome } from '../store/home.js';

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
  const missing = missingPackages(['agent', 'kernel', 'rootfs']);
  out.push(missing.length ? `setup tools missing: apt-get install ${missing.join(' ')}` : 'setup tools: all present');
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
  if (detectHostFromSysfs().kind === 'pvm' && !kernel && !record.kernel?.source) out.push(`note: ${PVM_KERNEL_NOTE}`);
  process.stdout.write(out.join('\n') + '\n');
  return ok ? 0 : 1;
}
