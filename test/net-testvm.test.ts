// virtio-net end to end on this machine, through the test guest (guest/testvm drives the
// device): the guest's ARP request for the gateway goes down the tx queue, through the
// socketpair to passt, and passt's answer comes back up the rx queue. Without a backend the
// link is down and nothing answers; a backend that dies takes the link down with a reason.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { TorporError } from '../lib/errors.js';
import { macFor } from '../lib/net/options.js';
import { Passt } from '../lib/net/passt.js';
import { Machine } from '../lib/vm/machine.js';
import { bound } from './bounds.js';
import { needsCommands, testUnless } from './skip-unless.js';
import { bootTestvm, testvmCommand, testvmSkipReason } from './vmm-guests.js';

const netTest = testUnless('net-testvm', testvmSkipReason() ?? needsCommands('passt'), 'kvm');

const MAC = macFor('net-testvm');
const network = { egress: true, allowHostLoopback: false, ports: [] };

netTest('the guest ARPs for the gateway through virtio-net and passt answers', async () => {
  await using m = await bootTestvm({ net: { mac: MAC } });
  assert.match(m.consoleTail().toString(), /virtio=\d+ type=net /);
  const passt = await Passt.start({ fd: m.netAttachPair(), network });
  try {
    const line = await testvmCommand(m, 'net-arp', 'net-arp');
    const mac = MAC.replaceAll(':', '');
    assert.match(line, new RegExp(`^net-arp=ok mac=${mac} link=1 gateway=[0-9a-f]{12}$`));
    assert.is.not(/gateway=([0-9a-f]+)/.exec(line)![1], mac, 'the answer is passt, not an echo');
    assert.is(m.netBackendError(), '');
  } finally {
    await passt.stop();
  }
});

netTest('without a backend the link is down and an ARP gets no answer; a dead backend says why', async () => {
  await using m = await bootTestvm({ net: { mac: MAC } });
  const none = await testvmCommand(m, 'net-arp', 'net-arp');
  assert.is(none, 'net-arp=error reason=rx-timeout');
  const passt = await Passt.start({ fd: m.netAttachPair(), network });
  let died: TorporError | undefined;
  passt.onUnexpectedExit((e) => (died = e));
  process.kill(passt.pid!, 'SIGKILL');
  // Two observers of one death, in no set order: the device sees its socket close (I/O thread),
  // Node sees the child exit (its event loop); wait for both.
  const deadline = Date.now() + bound(5000);
  while ((m.netBackendError() === '' || died === undefined) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  assert.match(m.netBackendError(), /closed its socket/);
  assert.ok(died instanceof TorporError && died.code === 'NET_BACKEND');
  // A fresh backend brings the network back: what a resume will do.
  const again = await Passt.start({ fd: m.netAttachPair(), network });
  try {
    assert.match(await testvmCommand(m, 'net-arp', 'net-arp'), /^net-arp=ok .* link=1 /);
  } finally {
    await again.stop();
  }
});

netTest('a snapshot keeps the device and its MAC; the restored machine ARPs again through a fresh passt', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'torpor-net-snap-'));
  {
    const m = await bootTestvm({ net: { mac: MAC } });
    const passt = await Passt.start({ fd: m.netAttachPair(), network });
    try {
      assert.match(await testvmCommand(m, 'net-arp', 'net-arp'), /^net-arp=ok /);
      await m.snapshot(dir, { stop: true });
    } finally {
      await m.stop();
      await passt.stop();
    }
  }
  await using back = await Machine.restore(dir);
  const passt = await Passt.start({ fd: back.netAttachPair(), network });
  try {
    const line = await testvmCommand(back, 'net-arp', 'net-arp');
    assert.match(line, new RegExp(`^net-arp=ok mac=${MAC.replaceAll(':', '')} link=1 gateway=[0-9a-f]{12}$`));
  } finally {
    await passt.stop();
  }
});

test.run();
