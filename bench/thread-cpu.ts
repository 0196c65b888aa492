// CPU time this process spent across a stretch of a benchmark, split into the guests' vCPU
// threads (torpor-vcpuN: the guest running, and KVM's work for it) and every other thread (JS,
// the thread pool, the VMM's I/O and pool threads): from /proc/self/task/<tid>/schedstat, ns on
// a CPU. What a wall-clock figure cannot separate on a small host: on PVM the test guest runs
// in KVM's instruction emulator, milliseconds of CPU for a round trip its agent answers in
// microseconds on hardware, so a call that waits on guests is bound by that emulation there.
// The JS thread's share is given apart as well: it is one thread, so its CPU is a floor under
// the call's wall time on any host, however many cores the rest spreads over.
// A thread that ends inside the stretch is not counted: sample before stopping machines.
import { readdirSync, readFileSync } from 'node:fs';

/** Each live thread's CPU time so far (ns), whether it is a vCPU thread, and whether it is the JS thread. */
export type ThreadCpuSample = Map<string, { ns: number; vcpu: boolean; js: boolean }>;

export function sampleThreadCpu(): ThreadCpuSample {
  const out: ThreadCpuSample = new Map();
  for (const tid of readdirSync('/proc/self/task')) {
    try {
      const comm = readFileSync(`/proc/self/task/${tid}/comm`, 'utf8').trim();
      const ns = Number(readFileSync(`/proc/self/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
      // A tid may be reused by a later thread; its comm tells a vCPU's apart from another's.
      out.set(`${tid}/${comm}`, { ns, vcpu: /^torpor-vcpu\d+$/.test(comm), js: tid === String(process.pid) });
    } catch {
      // ended between readdir and read: not counted (see above)
    }
  }
  return out;
}

/** CPU ms between two samples: the vCPU threads', the rest's (threads born meanwhile count in
 *  full), and of the rest the JS thread's alone. */
export function threadCpuSince(before: ThreadCpuSample, after: ThreadCpuSample = sampleThreadCpu()): { guestMs: number; hostMs: number; jsMs: number } {
  let guest = 0;
  let host = 0;
  let js = 0;
  for (const [key, t] of after) {
    const d = t.ns - (before.get(key)?.ns ?? 0);
    if (t.vcpu) guest += d;
    else host += d;
    if (t.js) js += d;
  }
  return { guestMs: guest / 1e6, hostMs: host / 1e6, jsMs: js / 1e6 };
}
