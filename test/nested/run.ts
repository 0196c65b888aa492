// The nested-KVM test host: runs a command inside "L1", a Linux that QEMU's
// emulator boots with an emulated AMD CPU with SVM and nested paging, where
// /dev/kvm is a hardware-virtualization KVM. So the Linux-guest tests run on a
// host whose own /dev/kvm cannot boot Linux (a PVM host) and in CI.
//
//   npm run test:linux                 the Linux suite (test/nested/suite.ts)
//   npm run test:linux -- <command>    any shell command, run in the checkout
//
// L1's root is the host's root, read-only over 9p; the checkout is shared
// writable at the same path; TORPOR_HOME is copied into a tmpfs inside. The
// command's output (with L1's console) is printed live; the exit status is the
// command's, or one of the codes below when the nested host itself failed.
// Details, traps and timings: docs/nested.md.
import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { appendFileSync, closeSync, existsSync, mkdtempSync, openSync, readFileSync, readSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { connect } from 'node:net';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

import { ensureArtifacts, type SetupReport } from '../../lib/setup/artifacts.js';
import { baseArtifactDir } from '../../lib/setup/rootfs.js';
import { streamProgress } from '../../lib/setup/progress.js';
import { homeLayout, torporHome } from '../../lib/store/home.js';
import { ensureNodeImage, nodeImageSkipReason } from '../image-fixtures/node-image.js';
import { compileCheckout } from './compiled-checkout.js';
import { FileClock } from './file-clock.js';
import { ensureL1Kernel } from './l1-kernel.js';
import { selectedFiles } from './suite.js';

/** Exit codes for failures of the nested host (not of the command). */
export const NESTED_EXIT = {
  /** L1 never reached userspace, panicked, or ended without writing a status. */
  l1Failed: 70,
  /** L1 runs but has no /dev/kvm, or torpor doctor there does not see a hardware-virtualization host. */
  noHardwareKvm: 71,
  /** The whole run took longer than NESTED_TIMEOUT_S: L1 was killed. */
  timeout: 72,
  /** Could not start: QEMU missing or refusing its options, the L1 kernel or the guest artifacts not buildable. */
  setup: 73,
} as const;

/** The first QEMU major version the nested suite ran clean on (docs/nested.md, "The emulated machine's own failures"). */
const QEMU_TRUSTED_MAJOR = 10;

const checkout = fileURLToPath(new URL('../..', import.meta.url)).replace(/\/$/, '');
const SUITE = 'node --import tsx test/nested/suite.ts';
/** A fresh L1 after a wedge needs this much of NESTED_TIMEOUT_S left to be worth booting: its
 *  boot and TORPOR_HOME copy (~30 s) and at least the longest test file (~200 s). */
const MIN_RESUME_S = 300;
/** Serial BREAKs the runner may send to a silent L1 in one boot (a wedge each). */
const MAX_BREAKS = 5;

function envNumber(name: string, fallback: number): number {
  const v = process.env[name];
  if (v === undefined || v === '') return fallback;
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) fail(NESTED_EXIT.setup, `${name}=${v} is not a positive number`);
  return n;
}

function envCount(name: string, fallback: number): number {
  const v = process.env[name];
  if (v === undefined || v === '') return fallback;
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) fail(NESTED_EXIT.setup, `${name}=${v} is not a whole number`);
  return n;
}

function fail(code: number, message: string): never {
  process.stderr.write(`\nnested: ${message}\n`);
  process.exit(code);
}

/** The host TSC's frequency in kHz: TCG's guest TSC ticks at the host's rate. */
function hostTscKhz(): number {
  const m = /^cpu MHz\s*:\s*([\d.]+)/m.exec(readFileSync('/proc/cpuinfo', 'utf8'));
  if (!m) fail(NESTED_EXIT.setup, 'cannot read the CPU frequency from /proc/cpuinfo');
  return Math.round(Number(m[1]) * 1000);
}

const shellQuote = (s: string): string => `'${s.replaceAll("'", `'\\''`)}'`;

/**
 * What L1 needs from TORPOR_HOME, relative to it: the artifact directories the
 * current setup resolves to (kernel, rootfs, its base image, agent); not older
 * builds nor the L1 kernel, which L1's RAM would hold for nothing.
 */
async function homePaths(home: string, report: SetupReport, extra: string[] = []): Promise<string[]> {
  const layout = homeLayout(home);
  const dirs = [dirname(report.kernel), dirname(report.rootfs), dirname(report.agent), await baseArtifactDir(layout.artifacts), ...extra];
  // setup.json stays behind: a kernel it records (one built for a PVM host) is not what L1 must boot.
  // (A kernel from the installed kernel package is torpor's own, as released.)
  if (report.kernelOrigin === 'supplied') {
    fail(
      NESTED_EXIT.setup,
      `this TORPOR_HOME boots a supplied kernel (${report.kernel}); the nested host runs torpor's own kernel: ` +
        'use another TORPOR_HOME, or `torpor setup --own-kernel`',
    );
  }
  const out = dirs.map((d) => relative(home, d));
  const outside = out.find((p) => p.startsWith('..'));
  if (outside) fail(NESTED_EXIT.setup, `an artifact lies outside TORPOR_HOME (${outside}): the nested host copies only TORPOR_HOME`);
  return out;
}

/** Follows a growing file (QEMU's serial log), line by line, until stopped. */
function follow(path: string, onLine: (line: string) => void): { stop: () => void } {
  let fd = -1;
  let partial = '';
  const buf = Buffer.alloc(1 << 16);
  const poll = (): void => {
    if (fd < 0) {
      if (!existsSync(path)) return;
      fd = openSync(path, 'r');
    }
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, null);
      if (n <= 0) break;
      partial += buf.toString('utf8', 0, n);
      const lines = partial.split('\n');
      partial = lines.pop()!;
      for (const line of lines) onLine(line.replace(/\r$/, ''));
    }
  };
  const timer = setInterval(poll, 100);
  return {
    stop: () => {
      clearInterval(timer);
      poll();
      if (partial) onLine(partial);
      if (fd >= 0) closeSync(fd);
    },
  };
}

/** What QEMU's human monitor (on a unix socket) answers to `command`, read for up to 3 s. */
function monitorSays(path: string, command: string): Promise<string> {
  return new Promise((resolve) => {
    let said = '';
    const sock = connect(path);
    const done = (): void => {
      sock.destroy();
      // The monitor's banner, prompt and control sequences (it edits its own line) go, and the
      // FPU and vector registers, which say nothing of where a CPU is stuck.
      const noise = /^QEMU .*monitor|^\(qemu\)|^(FCW|FPR|XMM|YMM|ZMM|DR[0-9])/;
      resolve(said.replace(/\x1b\[[0-9;]*[A-Za-z]/g, '').replace(/\r/g, '').split('\n').filter((l) => l && !noise.test(l)).join('\n'));
    };
    const timer = setTimeout(done, 3000);
    sock.on('data', (d: Buffer) => (said += d.toString()));
    sock.on('error', (err) => {
      said += `(monitor: ${err.message})`;
      clearTimeout(timer);
      done();
    });
    sock.on('connect', () => sock.write(`${command}\n`));
  });
}

/** The instruction pointer in the monitor's `info registers`. */
const RIP = /RIP=([0-9a-f]+)/;

/**
 * What a silent L1's CPU is doing: its registers, where it is over the next seconds (one RIP:
 * stuck; a few close together: spinning in a loop) and its local APIC (an interrupt pending
 * in IRR while the CPU runs with IF=1 is one the emulation never delivers).
 */
async function wedgedCpuState(monitor: string): Promise<string> {
  const registers = await monitorSays(monitor, 'info registers');
  const rips: string[] = [];
  const from = performance.now();
  for (let i = 0; i < 4; i++) {
    await new Promise((r) => setTimeout(r, 700));
    const rip = RIP.exec(await monitorSays(monitor, 'info registers'))?.[1];
    rips.push(rip ?? '?');
  }
  const lapic = await monitorSays(monitor, 'info lapic');
  const over = ((performance.now() - from) / 1000).toFixed(0);
  return `${registers}\nRIP sampled over the next ${over} s: ${rips.join(' ')}\nLocal APIC (info lapic):\n${lapic}`;
}

/**
 * NESTED_WEDGE_GDB: what QEMU's own state says about a wedged CPU, read with gdb from a QEMU
 * built with debug information (NESTED_QEMU): its threads' stacks and the fields that decide
 * whether an interrupt is taken (QEMU 10's x86_cpu_pending_interrupt), sampled three times.
 */
function insideQemu(pid: number): string {
  const cpu = 'cpus_queue.tqh_first';
  const env = `((X86CPU *)${cpu})->env`;
  const fields = [
    `${cpu}->interrupt_request`, `${cpu}->exit_request`, `${cpu}->halted`, `${cpu}->exception_index`,
    `${cpu}->cflags_next_tb`, `${cpu}->neg.icount_decr.u32`, `${env}.hflags`, `${env}.hflags2`, `${env}.eflags`,
    `${env}.int_ctl`, `${env}.intercept`, `${env}.eip`, `${env}.regs[2]`, `${env}.vm_vmcb`, `${env}.old_exception`,
  ];
  const samples: string[] = [];
  for (let i = 0; i < 3; i++) {
    // gdb's echo drops a plain trailing space; \040 keeps it.
    const args = ['-p', String(pid), '-batch', '-nx', ...fields.flatMap((f) => ['-ex', `echo ${f}\\040`, '-ex', `p/x ${f}`])];
    if (i === 0) args.push('-ex', 'thread apply all bt 14');
    const gdb = spawnSync('gdb', args, { encoding: 'utf8', timeout: 120_000, maxBuffer: 16 << 20 });
    const lines = (gdb.stdout ?? '').split('\n').filter((l) => / = 0x|^Thread|^#/.test(l));
    samples.push(`gdb sample ${i + 1}:\n${lines.join('\n') || `(gdb: ${gdb.error ?? (gdb.stderr ?? '').slice(-400)})`}`);
  }
  return samples.join('\n');
}

async function main(): Promise<number> {
  const args = process.argv.slice(2);
  const command = args.length ? args.join(' ') : SUITE;
  // Only the suite can go on after a wedge: it knows which of its files finished.
  const resumable = command === SUITE;
  const timeoutS = envNumber('NESTED_TIMEOUT_S', 25 * 60);
  const bootTimeoutS = envNumber('NESTED_BOOT_TIMEOUT_S', 180);
  // L1's init prints a heartbeat every 30 s: this long without one, L1 has stopped making progress.
  const silenceS = envNumber('NESTED_SILENCE_S', 240);
  const breakS = envNumber('NESTED_BREAK_S', 60);
  // Fresh L1 boots the suite may take after wedges; 0: a wedge fails the run. One by default: a
  // wedge is QEMU losing an interrupt, rare (docs/nested.md, "The emulated machine's own failures"); a second one in the
  // same run is more than that rarity explains, and a run that needs it fails.
  const maxResumes = resumable ? envCount('NESTED_WEDGE_RESUMES', 1) : 0;
  // One L1 CPU by default: with two, under heavy guest traffic an L1 vCPU halted and was never
  // woken again (QEMU 10.0), and L1's memory was corrupted in suite runs (7.2 and 10.0); one
  // CPU ran the same load clean (docs/nested.md, "The emulated machine's own failures"). Guests with 2 vCPUs still run.
  const smp = envNumber('NESTED_SMP', 1);
  const memoryMiB = envNumber('NESTED_MEMORY_MIB', 6144);
  const tcg = process.env.NESTED_TCG ?? 'multi';
  // The emulated CPU: an AMD with SVM and nested paging, which TCG emulates. A knob so that
  // L1 wedges can be tried against other feature sets (docs/nested.md, "The emulated machine's own failures").
  const cpu = process.env.NESTED_CPU ?? 'max,vendor=AuthenticAMD,+svm,+npt';
  if (tcg !== 'multi' && tcg !== 'single') fail(NESTED_EXIT.setup, `NESTED_TCG=${tcg}: multi or single`);

  // NESTED_QEMU: another QEMU binary (one built with debug information, to look inside a wedge).
  const qemu = process.env.NESTED_QEMU ?? 'qemu-system-x86_64';
  const version = spawnSync(qemu, ['--version'], { encoding: 'utf8' });
  if (version.status !== 0) fail(NESTED_EXIT.setup, `${qemu} not found: apt-get install qemu-system-x86`);
  const qemuVersion = /version (\d+)\.(\d+)(?:\.(\d+))?/.exec(version.stdout);
  const qemuMajor = qemuVersion ? Number(qemuVersion[1]) : 0;
  if (qemuMajor < QEMU_TRUSTED_MAJOR) {
    // Not refused (a run may still pass, and it is the only nested host some machines have),
    // but said at the top of the log, where a reader of a random guest oops looks first.
    process.stderr.write(
      `nested: WARNING: QEMU ${qemuVersion ? qemuVersion.slice(1).filter(Boolean).join('.') : '(unknown version)'}: ` +
        `its emulated SVM made guests in L1, and L1 itself, fail at random under load (QEMU 7.2); ` +
        `use ${QEMU_TRUSTED_MAJOR}.x or later (Debian bookworm: apt-get install -t bookworm-backports qemu-system-x86; docs/nested.md)\n`,
    );
  }
  const t0 = performance.now();
  const since = (): string => `${((performance.now() - t0) / 1000).toFixed(1)} s`;

  let l1;
  let home;
  let report;
  let nodeImage: string | undefined;
  try {
    l1 = await ensureL1Kernel();
    process.stderr.write(`nested: L1 kernel ${l1.path} (${l1.built ? `built in ${(l1.buildMs / 1000).toFixed(0)} s` : 'cached'})\n`);
    // The guest artifacts the tests boot, built on the host (inside L1 a build would run emulated).
    home = torporHome();
    report = await ensureArtifacts({ onProgress: streamProgress(process.stderr) });
    // The node image of test/template-linux.test.ts (an OCI layout from Debian's packages, built
    // with mmdebstrap here: L1 has no apt). Where it cannot be built, the test says why.
    const artifacts = homeLayout(home).artifacts;
    if ((await nodeImageSkipReason(artifacts)) === null) {
      nodeImage = (await ensureNodeImage(artifacts, { onProgress: (line) => process.stderr.write(`nested: node image: ${line}\n`) })).dir;
    }
  } catch (err) {
    fail(NESTED_EXIT.setup, `preparing the nested host failed: ${(err as Error).message}`);
  }
  const make = spawnSync('make', ['-s', '-C', join(checkout, 'guest', 'testvm')], { stdio: 'inherit' });
  if (make.status !== 0) fail(NESTED_EXIT.setup, 'building the test guest (make -C guest/testvm) failed');
  if (!process.env.TORPOR_ADDON && !existsSync(join(checkout, 'build', 'Release', 'torpor.node'))) {
    fail(NESTED_EXIT.setup, 'the native addon is not built in this checkout (npm ci, or npx node-gyp rebuild)');
  }

  // The suite's child Node processes (test/child-node.ts) and the CLI tests' `torpor` runs
  // (test/fixtures/cli.ts) start from the checkout compiled here (test/nested/compiled-checkout.ts),
  // as the published package runs dist/, not through tsx: in L1 a tsx start of the CLI took 50 to
  // 100 s against 5 to 10 compiled, and cli-sandbox makes 16 (840 s in a clean-clone CI run,
  // 2026-12-07); sandbox-pause, vmm-linux-snapshot and others start children as often.
  let compiled: string | undefined;
  if (command.includes('test/nested/suite.ts')) {
    try {
      selectedFiles(); // a bad NESTED_SUITE_PART or NESTED_SUITE_FILES fails here, before the build
      compiled = compileCheckout(checkout);
    } catch (err) {
      fail(NESTED_EXIT.setup, `compiling this checkout for the suite's child processes: ${(err as Error).message}`);
    }
    const dir = compiled;
    process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  }

  const run = mkdtempSync(join(tmpdir(), 'torpor-nested-'));
  writeFileSync(join(run, 'command'), command + '\n');
  writeFileSync(join(run, 'home-paths'), (await homePaths(home, report, nodeImage ? [nodeImage] : [])).join('\n') + '\n');
  const env: Record<string, string> = { TORPOR_HOME: '/tmp/torpor-home', TORPOR_NESTED: '1', NESTED_STARTED_MS: String(Date.now()) };
  // npm's cache on this host (L1 sees it read-only, and its own HOME is elsewhere): test/first-run
  // publishes torpor's dependencies from it into the npm registry it starts, as it does here.
  const npmCache = spawnSync('npm', ['config', 'get', 'cache'], { encoding: 'utf8' }).stdout?.trim();
  if (npmCache) env.TORPOR_TEST_NPM_CACHE = npmCache;
  if (compiled) {
    env.TORPOR_TEST_BUILD = compiled;
    env.TORPOR_TEST_CLI_LIB = join(compiled, 'lib');
  }
  // The suite keeps what it finished in the run share, so a fresh L1 can go on after a wedge.
  if (resumable) {
    env.NESTED_SUITE_STATE = '/run/nested/suite-state.json';
    env.NESTED_WEDGE_LOG = '/run/nested/wedges';
  }
  // NESTED_FILE_LIMIT_S, NESTED_SUITE_FILES and NESTED_SUITE_PART are read inside L1, by the suite
  // (test/nested/suite.ts); TORPOR_TEST_STOP_VCPUS by the VMM's Machine (a guest hung on purpose, docs/nested.md).
  for (const name of ['CI', 'TORPOR_ADDON', 'NO_COLOR', 'FORCE_COLOR', 'TERM', 'NESTED_FILE_LIMIT_S', 'NESTED_SUITE_FILES', 'NESTED_SUITE_PART', 'TORPOR_TEST_STOP_VCPUS']) {
    if (process.env[name] !== undefined) env[name] = process.env[name]!;
  }
  writeFileSync(join(run, 'env'), Object.entries(env).map(([k, v]) => `export ${k}=${shellQuote(v)}\n`).join(''));

  // NESTED_TIMEOUT_S counts from the first boot (the builds above are not L1's time).
  const deadline = performance.now() + timeoutS * 1000;
  const opts: BootOptions = {
    run, command, qemu, kernel: l1.path, home, deadline, timeoutS, bootTimeoutS, silenceS, breakS, smp, memoryMiB, tcg, cpu, since,
    qemuVersion: qemuVersion?.[0]?.replace('version ', '') ?? '?',
    freezeIn: process.env.NESTED_FREEZE_IN,
    stalls: [],
  };
  // Said last, whatever the end (fail() exits through it too): every wedge, every file run again
  // after one, and every stall a BREAK ended. NESTED_REPORT: a file CI's summary reads it from.
  process.on('exit', () => reportIncidents(run, command, opts.stalls, maxResumes));
  for (let boot = 1; ; boot++) {
    // A wedge ends a boot, not the suite: while resumes and time are left, a fresh L1 goes on
    // from the file the wedge interrupted (test/nested/suite-state.ts).
    const mayResume = (): boolean => boot <= maxResumes && (deadline - performance.now()) / 1000 > MIN_RESUME_S;
    const result = await bootL1(opts, boot, mayResume);
    if (result !== 'wedged') return result;
    process.stdout.write(
      `\nnested: boot ${boot + 1} of L1, ${((deadline - performance.now()) / 1000).toFixed(0)} s left (NESTED_TIMEOUT_S): ` +
        `the suite resumes where the wedge stopped it (resume ${boot} of at most ${maxResumes}, NESTED_WEDGE_RESUMES)\n`,
    );
  }
}

interface BootOptions {
  run: string;
  command: string;
  qemu: string;
  qemuVersion: string;
  kernel: string;
  home: string;
  /** When the whole run, every boot, must end (performance.now() ms). */
  deadline: number;
  timeoutS: number;
  bootTimeoutS: number;
  silenceS: number;
  breakS: number;
  smp: number;
  memoryMiB: number;
  tcg: string;
  cpu: string;
  since: () => string;
  /** NESTED_FREEZE_IN: a test file at whose start the first boot's CPU is stopped through the
   *  monitor (`stop`), a stand-in for a wedge to try the resume with by hand. */
  freezeIn?: string;
  /** Stalls that a BREAK ended (no boot lost): where and how long, for the run's summary. */
  stalls: string[];
}

/**
 * The run's incidents, printed last when there were any, and always appended to NESTED_REPORT
 * (CI's summary: a run with none says so, so the summary shows it was looked at): the wedges (a
 * boot lost, and the file it interrupted, which the next boot ran again from its start) and the
 * stalls a BREAK ended.
 */
function reportIncidents(run: string, command: string, stalls: string[], maxResumes: number): void {
  const wedgeLog = join(run, 'wedges');
  const wedges = existsSync(wedgeLog) ? readFileSync(wedgeLog, 'utf8').split('\n').slice(0, -1) : [];
  const lines = [
    wedges.length
      ? `L1 wedges: ${wedges.length} (at most ${maxResumes} resumed, NESTED_WEDGE_RESUMES): ` +
        wedges.map((w, i) => `boot ${i + 1} lost${w ? ` in ${w}.test.ts, which ran again from its start` : ' between files'}`).join('; ')
      : 'L1 wedges: none',
    stalls.length ? `L1 stalls ended by a BREAK (no file ran again): ${stalls.length}: ${stalls.join('; ')}` : 'L1 stalls ended by a BREAK: none',
  ];
  if (wedges.length || stalls.length) process.stdout.write(`\n${lines.map((l) => `nested: ${l}`).join('\n')}\n`);
  // Which run this was: the suite's command is the same for a part of it or the hang check.
  const part = process.env.NESTED_SUITE_FILES
    ? ` (NESTED_SUITE_FILES=${process.env.NESTED_SUITE_FILES})`
    : process.env.NESTED_SUITE_PART
      ? ` (NESTED_SUITE_PART=${process.env.NESTED_SUITE_PART})`
      : '';
  const hook = process.env.TORPOR_TEST_STOP_VCPUS === '1' ? ' (guests hung on purpose: the hang check)' : '';
  if (process.env.NESTED_REPORT) appendFileSync(process.env.NESTED_REPORT, `${command}${part}${hook}\n${lines.map((l) => `  ${l}\n`).join('')}`);
}

/** QEMU processes running now, killed on Ctrl-C or a CI cancel. */
const runningQemu = new Set<ChildProcess>();
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  process.on(sig, () => {
    // Never leave an emulated machine running.
    for (const child of runningQemu) child.kill('SIGKILL');
    process.stderr.write(`\nnested: ${sig}: L1 killed\n`);
    process.exit(130);
  });
}

/**
 * Boots L1 once and runs the command in it: the command's exit status, or 'wedged' when L1
 * went silent (a wedge) and `mayResume()` allows another boot; every other failure of the nested host exits here with
 * its NESTED_EXIT code.
 */
async function bootL1(o: BootOptions, boot: number, mayResume: () => boolean): Promise<number | 'wedged'> {
  const { run, command, qemu, home, timeoutS, bootTimeoutS, silenceS, breakS, smp, memoryMiB, tcg, cpu, since } = o;
  // Each boot its own console log and monitor socket; the first keeps the names docs and CI logs use.
  const log = join(run, boot === 1 ? 'console.log' : `console-${boot}.log`);
  const monitorPath = join(run, boot === 1 ? 'monitor.sock' : `monitor-${boot}.sock`);
  rmSync(join(run, 'status'), { force: true });
  const cmdline = [
    'console=ttyS0',
    'root=hostroot rootfstype=9p rootflags=trans=virtio,version=9p2000.L,msize=262144,cache=loose ro',
    `init=${join(checkout, 'test', 'nested', 'l1-init.sh')}`,
    // Under load L1's TSC calibration against the PIT can fail (tsc_khz = 0), after
    // which its KVM never enters a guest: give it the frequency (docs/nested.md).
    `tsc_early_khz=${hostTscKhz()} tsc=reliable`,
    // An L1 kernel problem ends L1 at once instead of hanging until the timeout.
    'oops=panic panic=1 reboot=t',
    `nested.checkout=${checkout}`,
    `hostdate=${Math.floor(Date.now() / 1000)}`,
  ].join(' ');
  const fsdev = (id: string, path: string, readonly: boolean): string[] => [
    // multidevs=remap: without it the host's many filesystems collide in inode
    // numbers over 9p, and L1's /proc shows the host's procfs.
    '-fsdev',
    `local,id=${id},path=${path},security_model=none,multidevs=remap${readonly ? ',readonly=on' : ''}`,
    '-device',
    `virtio-9p-device,fsdev=${id},mount_tag=${id}`,
  ];
  const qemuArgs = [
    '-accel', `tcg,thread=${tcg},tb-size=512`,
    '-M', 'microvm,acpi=off',
    '-cpu', cpu,
    '-m', `${memoryMiB}M`,
    '-smp', String(smp),
    // The monitor answers while the emulated CPU spins: a wedged L1's CPU state is read from it.
    '-display', 'none', '-monitor', `unix:${monitorPath},server=on,wait=off`, '-no-reboot',
    '-serial', `file:${log}`,
    '-kernel', o.kernel,
    '-append', cmdline,
    ...fsdev('hostroot', '/', true),
    ...fsdev('checkout', checkout, false),
    ...fsdev('run', run, false),
    ...fsdev('torporhome', home, true),
  ];
  process.stderr.write(
    `nested: booting L1${boot > 1 ? ` (boot ${boot})` : ''} (QEMU ${o.qemuVersion}, TCG ${tcg}-threaded, ${smp} vCPUs, ${memoryMiB} MiB, -cpu ${cpu}); ` +
      `console log ${log}; timeout ${timeoutS} s for the whole run\n`,
  );
  process.stderr.write(`nested: running: ${command}\n`);

  // Live output: L1's boot messages are kept for a failure report, not printed;
  // from userspace on, everything is (kernel warnings included).
  const bootLines: string[] = [];
  const tail: string[] = [];
  let userspaceAt: string | undefined;
  let markerStatus: string | undefined;
  let panic: string | undefined;
  let ignoredMsrs = 0;
  // Any line from L1 (for "L1 answered" after a BREAK), and L1's own heartbeat: only its silence
  // is a wedge. A test waiting on a hung guest keeps L1 beating; its file limit (the suite's
  // NESTED_FILE_LIMIT_S) catches it, and it fails the run instead of being resumed.
  let lastAlive = performance.now();
  let lastBeat = performance.now();
  let lastBreakAt = 0;
  let frozen = false;
  const bootStart = performance.now();
  // Which test file the console shows running: where a wedge struck (the suite's wedge log).
  const files = new FileClock();
  const follower = follow(log, (whole) => {
    // L1's first line since a BREAK: it answered, the wedge is over.
    if (lastBreakAt && lastAlive <= lastBreakAt) {
      const after = (performance.now() - lastBreakAt) / 1000;
      process.stdout.write(`nested: L1 answered ${after.toFixed(1)} s after the BREAK: the wedge is over\n`);
      o.stalls.push(`boot ${boot}${files.current ? ` in ${files.current}.test.ts` : ''}, ${((lastBreakAt - lastBeat) / 1000).toFixed(0)} s without a heartbeat, answered ${after.toFixed(1)} s after the BREAK`);
    }
    lastAlive = performance.now();
    if (/nested: (alive at [\d.]+ s|userspace at)/.test(whole)) lastBeat = lastAlive;
    // L1's console echoes the BREAK's NUL as "^@" wherever its output stood.
    whole = whole.replaceAll('^@', '');
    // The heartbeat can land after another writer's unfinished line (uvu's dots): cut it out
    // wherever it is.
    const line = whole.replace(/nested: alive at [\d.]+ s/, '');
    if (!line) return;
    tail.push(line);
    if (tail.length > 60) tail.shift();
    if (/Kernel panic|BUG:|Oops|triple fault/.test(line) && !panic) panic = line;
    // L1's KVM logs this once per Linux guest (it probes AMD K7 perf-counter MSRs): harmless noise.
    if (/Unhandled WRMSR\(0xc0010007\)|unhandled wrmsr: 0xc0010007/i.test(line)) {
      ignoredMsrs++;
      return;
    }
    const marker = /^nested: (?:userspace at|exit status (\S+))/.exec(line);
    if (marker && !userspaceAt) userspaceAt = `${((performance.now() - bootStart) / 1000).toFixed(1)} s`;
    if (marker?.[1] !== undefined) markerStatus = marker[1];
    if (!userspaceAt) {
      bootLines.push(line);
      if (panic) process.stdout.write(line + '\n');
      return;
    }
    process.stdout.write(line + '\n');
    files.feed(line + '\n', performance.now());
    if (o.freezeIn && boot === 1 && !frozen && line.replace(/\x1b\[[0-9;]*m/g, '').trim() === `${o.freezeIn}.test.ts`) {
      frozen = true;
      void monitorSays(monitorPath, 'stop').then(() =>
        process.stdout.write(`\nnested: NESTED_FREEZE_IN: L1's CPU stopped at the start of ${o.freezeIn}.test.ts, a stand-in for a wedge\n`),
      );
    }
  });

  const child = spawn(qemu, qemuArgs, { stdio: ['ignore', 'pipe', 'pipe'] });
  runningQemu.add(child);
  let qemuOutput = '';
  child.stdout.on('data', (d: Buffer) => (qemuOutput += d.toString()));
  child.stderr.on('data', (d: Buffer) => (qemuOutput += d.toString()));
  let killedFor: 'timeout' | 'boot' | 'silent' | undefined;
  const kill = (why: 'timeout' | 'boot' | 'silent'): void => {
    killedFor ??= why;
    child.kill('SIGKILL');
  };
  const overall = setTimeout(() => kill('timeout'), Math.max(0, o.deadline - performance.now()));
  let cpuState = '';
  // A wedge (docs/nested.md, "The emulated machine's own failures") is an interrupt QEMU lost: L1's timer vector sits in
  // its APIC's IRR but the CPU was never told, so L1 (halted, or running a nested guest that
  // spins) never takes it. Any new interrupt makes QEMU's APIC look at IRR again: after
  // NESTED_BREAK_S of silence the runner sends a BREAK on L1's serial console (`chardev-send-break`;
  // its receive-line-status interrupt reaches the APIC through the IOAPIC), at most MAX_BREAKS
  // per boot, and says so with the CPU's state. L1's kernel has no serial SysRq
  // (test/nested/l1.config), so to L1 the break is a NUL on its console and nothing more.
  // A boot silent to NESTED_SILENCE_S is killed.
  let breaks = 0;
  let breakPending = false;
  const silence = setInterval(() => {
    if (!userspaceAt || killedFor || breakPending) return;
    const silentFor = performance.now() - lastBeat;
    if (silentFor >= breakS * 1000 && silentFor < silenceS * 1000 && breaks < MAX_BREAKS && lastBeat > lastBreakAt) {
      breakPending = true;
      void wedgedCpuState(monitorPath).then(async (state) => {
        const rip = RIP.exec(state)?.[1] ?? '?';
        const irr = /^IRR\s+(.*)$/m.exec(state)?.[1]?.trim() || 'none';
        const halted = /HLT=1/.test(state) ? ', halted' : '';
        await monitorSays(monitorPath, 'chardev-send-break serial0');
        breaks++;
        lastBreakAt = performance.now();
        breakPending = false;
        process.stdout.write(
          `\nnested: no heartbeat from L1 for ${(silentFor / 1000).toFixed(0)} s (RIP ${rip}${halted}, APIC IRR ${irr}): sent a BREAK on its serial console ` +
            `to make QEMU deliver the interrupt it holds (${breaks} of at most ${MAX_BREAKS}; docs/nested.md, "The emulated machine's own failures")\n`,
        );
      });
      return;
    }
    if (silentFor < silenceS * 1000) return;
    killedFor = 'silent';
    void wedgedCpuState(monitorPath).then((said) => {
      cpuState = said + (process.env.NESTED_WEDGE_GDB === '1' ? `\n${insideQemu(child.pid!)}` : '');
      child.kill('SIGKILL');
    });
  }, 5_000);
  const bootTimer = setTimeout(() => {
    if (!userspaceAt) kill('boot');
  }, bootTimeoutS * 1000);
  const exit = await new Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: Error }>((resolve) => {
    child.on('error', (error) => resolve({ code: null, signal: null, error }));
    child.on('close', (code, signal) => resolve({ code, signal }));
  });
  runningQemu.delete(child);
  clearTimeout(overall);
  clearTimeout(bootTimer);
  clearInterval(silence);
  follower.stop();

  const statusFile = join(run, 'status');
  const status = existsSync(statusFile) ? readFileSync(statusFile, 'utf8').trim() : markerStatus;
  const summary = `L1 to userspace ${userspaceAt ?? 'never'}, whole run ${since()}` + (ignoredMsrs ? `, ${ignoredMsrs} ignored-MSR notes hidden` : '') +
    (breaks ? `, ${breaks} BREAK${breaks > 1 ? 's' : ''} sent to a silent L1` : '');
  const lastLines = (): string => (userspaceAt ? tail : bootLines.slice(-40)).join('\n');

  if (exit.error) fail(NESTED_EXIT.setup, `cannot run ${qemu}: ${exit.error.message}`);
  if (killedFor === 'timeout') {
    fail(NESTED_EXIT.timeout, `timed out after ${timeoutS} s (NESTED_TIMEOUT_S); L1 killed. ${summary}. Console log: ${log}\nLast lines:\n${lastLines()}`);
  }
  if (killedFor === 'silent') {
    const what =
      `L1 stopped: no heartbeat for ${silenceS} s (NESTED_SILENCE_S): its emulated CPU ` +
      `spins without progress (docs/nested.md, "The emulated machine's own failures"); L1 killed. ${summary}. Console log: ${log}\n` +
      `Its CPU state (QEMU monitor):\n${cpuState || '(the monitor did not answer)'}\nLast lines:\n${lastLines()}`;
    // Noted for the suite (NESTED_WEDGE_LOG) whether or not it resumes: its result line names each wedge.
    appendFileSync(join(run, 'wedges'), `${files.current ?? ''}\n`);
    if (!mayResume()) {
      fail(NESTED_EXIT.l1Failed, `${what}\n${boot > 1 ? `a wedge in boot ${boot}: more than the ${boot - 1} this run may resume (NESTED_WEDGE_RESUMES)` : 'not resumed (NESTED_WEDGE_RESUMES, or too little of NESTED_TIMEOUT_S left)'}; the run fails`);
    }
    process.stdout.write(`\nnested: ${what}\n`);
    return 'wedged';
  }
  if (killedFor === 'boot') {
    fail(NESTED_EXIT.l1Failed, `L1 did not reach userspace in ${bootTimeoutS} s; killed. Console log: ${log}\nLast lines:\n${lastLines()}`);
  }
  if (status === undefined) {
    if (userspaceAt === undefined && exit.code !== 0) {
      fail(NESTED_EXIT.setup, `${qemu} refused to start L1 (exit ${exit.code ?? exit.signal}): ${qemuOutput.trim() || '(no output)'}`);
    }
    fail(
      NESTED_EXIT.l1Failed,
      `L1 ended without an exit status (${panic ? `its kernel failed: ${panic}` : `QEMU exit ${exit.code ?? exit.signal}`}). ${summary}. ` +
        `Console log: ${log}\nLast lines:\n${lastLines()}${qemuOutput ? `\nQEMU: ${qemuOutput.trim()}` : ''}`,
    );
  }
  if (status === 'nokvm' || status === 'hostkind') {
    fail(
      NESTED_EXIT.noHardwareKvm,
      status === 'nokvm'
        ? "no /dev/kvm inside L1: the emulated CPU's SVM or L1's KVM is not working (see the lines above)"
        : 'inside L1, torpor doctor does not report a hardware-virtualization host (see above)',
    );
  }
  if (status === 'setup') fail(NESTED_EXIT.l1Failed, `L1 could not mount its shares or copy TORPOR_HOME. Console log: ${log}`);
  const code = Number(status);
  if (!Number.isInteger(code)) fail(NESTED_EXIT.l1Failed, `L1 wrote an unreadable status '${status}'`);
  process.stderr.write(`\nnested: command exited ${code}; ${summary}\n`);
  // A run that met a wedge keeps its console logs, the wedged boots' included.
  if (code === 0 && boot === 1) rmSync(run, { recursive: true, force: true });
  else process.stderr.write(`nested: console log kept: ${log}${boot > 1 ? ` (and the earlier boots' in ${run})` : ''}\n`);
  return code;
}

process.exit(await main());
