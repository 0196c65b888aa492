// The AgentClient through a real VM on any KVM host: the test guest (guest/testvm) answers
// HELLO, PING and ECHO on vsock port 1024. Covers reconnect after a vsock transport reset and a
// request id re-asked across that reset (answered from the guest's memory, not run again).
import { randomBytes } from 'node:crypto';
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { AgentClient } from '../lib/agent/client.js';
import { FieldWriter } from '../lib/agent/fields.js';
import { FrameType } from '../lib/agent/protocol.js';
import { TorporError } from '../lib/errors.js';
import { createAgentApi } from '../lib/sandbox/agent-api.js';
import { Machine } from '../lib/vm/machine.js';
import { bootTestvm, sleep, testvmCommand, testvmImage, testvmSkipReason } from './vmm-guests.js';
import { testUnless } from './skip-unless.js';

const image = testvmImage();
const kvmTest = testUnless('agent-testvm', testvmSkipReason(), 'kvm');

kvmTest('HELLO, PING, ECHO over vsock; reconnect after a transport reset; a re-asked id is answered from memory', async () => {
  const m = Machine.create({ kernel: image!, vcpus: 1, memoryMiB: 64, vsockCid: 3 });
  try {
    await m.start();
    await m.waitForConsole(/boot=ok[^\n]*\n/, 10_000);
    const client = await AgentClient.connect(() => m.vsockConnect(1024, 2000), { reconnect: true });
    assert.is(client.hello.version, 1);
    assert.match(client.hello.name, /^torpor-testvm/);
    assert.ok(client.supports('request_ids'));
    assert.not.ok(client.supports('exec'), 'the test guest announces no exec');
    const refused = await createAgentApi(client).commands.run(['true']).catch((e) => e);
    assert.ok(refused instanceof TorporError && /does not offer exec/.test(refused.message), 'no request for a feature not announced');

    const rtts: number[] = [];
    for (let i = 0; i < 50; i++) rtts.push(await client.ping());
    rtts.sort((a, b) => a - b);
    console.log(`  agent-testvm: PING over vsock p50 ${(rtts[25]! * 1000).toFixed(0)} us`);

    const payload = randomBytes(1500);
    const rid = 0x7e57_0000_0001n;
    const first = await client.call(FrameType.ECHO, new FieldWriter().bytes('data', payload), { requestId: rid });
    assert.ok(first.bytes('data')!.equals(payload));

    const closed = client.reconnects;
    m.vsockReset();
    // The client notices the reset, dials again and HELLOs; the next request waits for that.
    const deadline = Date.now() + 10_000;
    while (client.reconnects === closed && Date.now() < deadline) await sleep(10);
    assert.is(client.reconnects, closed + 1, 'reconnected after the transport reset');
    assert.ok((await client.ping()) > 0);

    // Same request id, different payload: the guest answers from memory with the first answer.
    const again = await client.call(FrameType.ECHO, new FieldWriter().bytes('data', Buffer.from('other')), { requestId: rid });
    assert.ok(again.bytes('data')!.equals(payload), 'answered from memory');
    const stats = await testvmCommand(m, 'vsock', 'vsock');
    assert.match(stats, /replays=1\b/);
    assert.match(stats, /transport_resets=1\b/);
    await client.close();
  } finally {
    await m.stop();
  }
});

test.run();
