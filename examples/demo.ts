// npm run demo: create a sandbox, run python, write and read a file.
// On a host that cannot boot a Linux guest it says why, then shows the same API against the
// agent running as a plain process on this host (clearly labelled: no VM involved there).
import { Sandbox, linuxGuestSupport } from '../lib/sandbox/sandbox.js';
import { createAgentApi, type AgentApi } from '../lib/sandbox/agent-api.js';
import { plainAgentEnv, startHostAgent } from '../lib/agent/host.js';

async function tour(api: AgentApi, where: string): Promise<void> {
  const t0 = performance.now();
  const py = await api.commands.run(['python3', '-c', 'import sys; print(sum(range(101)), sys.version.split()[0])'], {
    throwOnError: false,
  });
  const t1 = performance.now();
  console.log(`[${where}] python3 -> ${py.exitCode === 0 ? py.stdout.trim() : `exit ${py.exitCode}: ${py.stderr.trim()}`} (${(t1 - t0).toFixed(2)} ms)`);
  const path = `/tmp/torpor-demo-${process.pid}.txt`;
  await api.files.write(path, 'hello from torpor\n');
  const text = await api.files.read(path);
  console.log(`[${where}] wrote and read ${path}: ${JSON.stringify(text)}`);
  const info = await api.files.getInfo(path);
  console.log(`[${where}] getInfo: ${info.type}, ${info.size} bytes, mode ${(info.mode & 0o777).toString(8)}`);
  await api.files.remove(path);
}

const support = await linuxGuestSupport();
if (support.ok) {
  const t0 = performance.now();
  await using sbx = await Sandbox.create();
  console.log(`[sandbox] ${sbx.id} ready in ${(performance.now() - t0).toFixed(0)} ms`);
  await tour(sbx, 'sandbox');
} else {
  console.log(`This host cannot boot a Linux guest, so no sandbox here:\n  ${support.reason}\n`);
  console.log('Showing the same commands/files API against the torpor agent running as a plain process on this host');
  console.log('(HOST AGENT, NOT A VM: commands run on this machine, unisolated).\n');
  const agent = await startHostAgent({ env: plainAgentEnv() });
  const client = await agent.client();
  try {
    await tour(createAgentApi(client), 'host agent');
  } finally {
    await client.close();
    await agent.stop();
  }
}
