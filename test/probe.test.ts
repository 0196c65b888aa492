// The host probe (native probe() through lib/host/probe.ts) on this machine.
import { existsSync } from 'node:fs';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { formatProbe, probeHost, tryProbeHost } from '../lib/host/probe.js';
import { kvmSkipReason } from './vmm-guests.js';
import { testUnless } from './skip-unless.js';

const withKvm = testUnless('probe', kvmSkipReason(), 'kvm');

withKvm('reports API version 12, the host kind and the capabilities torpor needs', () => {
  const p = probeHost();
  assert.is(p.device, '/dev/kvm');
  assert.is(p.apiVersion, 12);
  const expectedKind = existsSync('/sys/module/kvm_pvm') ? 'pvm' : 'hardware';
  assert.is(p.hostKind, expectedKind);
  assert.match(p.cpuVendor, /^(GenuineIntel|AuthenticAMD|HygonGenuine|CentaurHauls)$/);
  for (const cap of ['irqchip', 'pit2', 'userMemory', 'immediateExit', 'ioeventfd']) assert.is(p.capabilities[cap], true, cap);
  for (const cap of ['dirtyLog', 'manualDirtyLogProtect', 'xsave', 'xcrs', 'kvmclockCtrl', 'preFaultMemory', 'irqfd', 'tscControl', 'xsave2'])
    assert.type(p.capabilities[cap], 'boolean', cap);
  assert.ok((p.capabilityValues.maxVcpus ?? 0) >= 2);
  assert.equal(p.missing, []);
  if (p.hostKind === 'pvm') assert.is(p.capabilities.tscControl, false, 'PVM has no TSC scaling');
});

test('a missing device gives KVM_UNAVAILABLE with the reason', () => {
  try {
    probeHost('/nonexistent/kvm');
    assert.unreachable('probe of a missing device succeeded');
  } catch (err) {
    assert.instance(err, TorporError);
    assert.is((err as TorporError).code, 'KVM_UNAVAILABLE');
    assert.match((err as Error).message, /\/nonexistent\/kvm does not exist/);
  }
});

test('a device that is not KVM gives KVM_UNAVAILABLE', () => {
  const r = tryProbeHost('/dev/null');
  assert.ok('error' in r);
  if ('error' in r) {
    assert.is(r.error.code, 'KVM_UNAVAILABLE');
    assert.match(formatProbe(r.error), /KVM: unavailable \(KVM_UNAVAILABLE\)/);
  }
});

withKvm('formatProbe prints the kind, every capability and what is missing', () => {
  const text = formatProbe(probeHost());
  assert.match(text, /API version 12/);
  assert.match(text, /Host kind: +(pvm|hardware)/);
  assert.match(text, /\[x\] irqchip/);
  assert.match(text, /Missing: +nothing/);
});

test.run();
