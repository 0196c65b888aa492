// `torpor` command line: sandboxes (ls, info, exec, shell, logs, pause, kill, prune), setup,
// template, doctor, help.
//
// Each command's module is imported when that command runs: every `torpor` start is Node loading
// lib/ module by module, and the sandbox commands need 67 of them, not the 102 that setup,
// template and doctor add (image pulls, the kernel and root filesystem builds).
import { TorporError } from '../errors.js';

export const USAGE = `usage: torpor <command> [options]

commands for sandboxes (any process's; a command that talks to the guest resumes a
paused sandbox and pauses it again before it exits; one another live process runs is
refused with SANDBOX_BUSY, naming that process):
  ls [--state STATE[,STATE]] [--json]
      The sandboxes under TORPOR_HOME: id, state, template, size, bytes on disk,
      the owning process, when created and paused.
  info ID [--json]
      One sandbox: state and owner, template, resources, when created, paused and
      resumed (from memory or from disk, and why), generation, bytes on disk.
  exec ID [--user U] [--cwd DIR] [--env KEY=VALUE]... [--timeout-ms N] -- PROGRAM [ARGS...]
      Run a program in the sandbox (an argv, no shell: -- bash -lc '...' for one),
      its output streamed; exits with the program's status.
  shell ID [--user U] [--cmd 'COMMAND']
      An interactive login shell (or COMMAND) on a pty sized like this terminal.
  logs ID PID [--from-offset N] [--timeout-ms N]
      A process's kept output (the last 1 MiB per stream), then what it prints
      until it ends, the timeout passes or Ctrl-C; exits with its status.
  pause ID [--json]
      Pause a sandbox whose owner died (a paused one is left as it is).
  kill ID
      Kill a sandbox and delete its directory.
  prune [--older-than DURATION] [--templates] [--dry-run] [--json]
      Kill sandboxes paused longer ago than DURATION (default 7d: 90s, 30m, 12h,
      7d, 2w) and remove the automatic templates nothing uses (--templates: your
      own unused templates too), fork bases nothing uses, and the directories of
      creates a crash interrupted (no meta.json, no owner) older than DURATION.
      Running sandboxes are never touched.

other commands:
  setup [--kernel PATH | --own-kernel] [--base-image REF | --debian-base] [--json] [--verify]
        [--install-deps [--dry-run]]
      Fetch or build (once) and store what Linux sandboxes boot from: the guest
      kernel and agent (prebuilt from @torpor/kernel-linux-x64 when installed,
      else built from source) and the base root filesystem (from a container
      image, no root; else Debian bookworm through mmdebstrap, as root).
      --kernel PATH  use this kernel instead of ours (vmlinux ELF or a 64-bit
                     bzImage); remembered for later runs. TORPOR_KERNEL=PATH
                     does the same for one run.
      --own-kernel   forget a remembered --kernel and use torpor's own kernel again
      --base-image REF  make the base root filesystem from this container image
                     (pin it by digest); remembered for later runs, as is
                     TORPOR_BASE_IMAGE=REF when setup runs with it
      --debian-base  forget a remembered base image: Debian packages again
      --json         print {"kernel","rootfs","agent","host",...} at the end: also
                     where each came from and what was built or fetched
      --verify       hash every stored artifact in full (default: size, mtime, header)
      --install-deps first install the missing Debian packages of
                     deps/debian-packages.txt (apt-get update, apt-get install;
                     through sudo when not root), then build
      --dry-run      with --install-deps: print the apt-get commands, run nothing
  template build --name NAME [--image REF | --oci-layout DIR | --docker-archive FILE | --from TEMPLATE]
                 [--run CMD]... [--env KEY=VALUE]... [--workdir DIR] [--user USER]
                 [--cpu N] [--memory-mb N] [--disk-mb N] [--json]
      Build a template: from a container image (pulled from its registry; docker's
      config.json credentials apply), an OCI layout, a docker save archive, 'base'
      (default) or another template; each --run runs in it, in order; the result
      (memory and disk) is what its sandboxes start from.
  template ls [--json]
      The templates: yours, then the automatic ones.
  template rm NAME [--force]
      Remove a template (refused while sandboxes use it, unless --force: its
      files then stay until nothing uses them).
  doctor
      Report what this host offers (/dev/kvm, KVM capabilities, hardware or PVM),
      where the kernel, agent and base root filesystem will come from, and what
      the first run will fetch or build.
  --help
      This text.

exit status: 0 done; 1 failed (the error's code and message on stderr); 2 bad usage;
  exec, shell and logs: the guest program's status, or 125 when torpor itself failed.

environment:
  TORPOR_HOME     where artifacts, templates and sandboxes live
                  (default $XDG_DATA_HOME/torpor or ~/.local/share/torpor)
  TORPOR_KERNEL   a guest kernel to use instead of ours (required for Linux guests on PVM hosts)
  TORPOR_BASE_IMAGE  a container image to make the base root filesystem from (no root)
  TORPOR_KERNEL_PACKAGE=0  build the kernel and agent from source even where the
                  prebuilt package is installed
`;

const HOME_HINT = ' (set TORPOR_HOME to a directory you own, or run as the user who owns this one)';
const SPACE_HINT = ' (free some disk space, or set TORPOR_HOME elsewhere)';

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  // exec, shell and logs pass the guest program's status through: torpor's own failure must not look like one.
  const failed = command === 'exec' || command === 'shell' || command === 'logs' ? 125 : 1;
  try {
    switch (command) {
      case 'setup':
        return await (await import('./setup.js')).runSetup(rest);
      case 'doctor':
        return await (await import('./doctor.js')).runDoctor(rest);
      case 'template':
        return await (await import('./template.js')).runTemplate(rest);
      case undefined:
        // A usage error: the text goes where errors go, so `torpor | less` users still see it and scripts see 2.
        process.stderr.write(USAGE);
        return 2;
      case '--help':
      case '-h':
      case 'help':
        process.stdout.write(USAGE);
        return 0;
      default: {
        const { SANDBOX_COMMANDS } = await import('./sandbox.js');
        if (Object.hasOwn(SANDBOX_COMMANDS, command)) return await SANDBOX_COMMANDS[command]!(rest);
        process.stderr.write(`torpor: unknown command '${command}'\n\n${USAGE}`);
        return 2;
      }
    }
  } catch (err) {
    if (err instanceof TorporError) {
      // The same hints as a system error's below, where the addon already made it a TorporError;
      // OUT_OF_SPACE with the host's errno is the host's disk (a guest's full filesystem has none).
      const hint = err.message.includes('TORPOR_HOME')
        ? ''
        : err.code === 'PERMISSION_DENIED'
          ? HOME_HINT
          : err.code === 'OUT_OF_SPACE' && err.errno !== undefined
            ? SPACE_HINT
            : '';
      process.stderr.write(`torpor: ${err.code}: ${err.message}${hint}\n`);
      return err.code === 'INVALID_ARGUMENT' ? 2 : failed;
    }
    // A system error that no layer below turned into a TorporError: one line a
    // user can act on, not a stack trace (which stays one env var away).
    const sys = err as NodeJS.ErrnoException;
    if (typeof sys?.code === 'string' && typeof sys.syscall === 'string' && !process.env.TORPOR_DEBUG) {
      const hint = sys.code === 'EACCES' || sys.code === 'EPERM' ? HOME_HINT : sys.code === 'ENOSPC' ? SPACE_HINT : '';
      const message = sys.message.startsWith(`${sys.code}:`) ? sys.message : `${sys.code}: ${sys.message}`;
      process.stderr.write(`torpor: ${message}${hint}\n`);
      return failed;
    }
    throw err;
  }
}

/** Entry point used by bin/torpor.js. */
export async function run(argv: string[] = process.argv.slice(2)): Promise<void> {
  process.exitCode = await main(argv);
}
