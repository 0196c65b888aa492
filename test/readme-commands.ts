// The README's "Contributing" commands, read from the README itself, so CI runs exactly what a
// newcomer is told to run and the two cannot drift apart.
//   node --import tsx test/readme-commands.ts          prints them, one a line
//   node --import tsx test/readme-commands.ts --run    runs them in order in the checkout; stops at the first failure
//   ... --run --in DIR                                  runs the README of the checkout at DIR, in DIR (.ci/run's fresh clone,
//                                                       where nothing is installed yet, so this script runs from another checkout)
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { stripVTControlCharacters } from 'node:util';

const checkout = fileURLToPath(new URL('..', import.meta.url));

/** The command lines of the first ```sh block under "## Contributing" (comments after '#' dropped). */
export function readmeCommands(readme: string = readFileSync(join(checkout, 'README.md'), 'utf8')): string[] {
  const section = /^## Contributing[^\n]*\n([\s\S]*?)(?=^## |(?![\s\S]))/m.exec(readme);
  if (!section) throw new Error('README.md has no "## Contributing" section');
  const block = /```sh\n([\s\S]*?)```/.exec(section[1]!);
  if (!block) throw new Error('README.md\'s "## Contributing" section has no ```sh block');
  return block[1]!
    .split('\n')
    .map((line) => line.replace(/\s#.*$/, '').trim())
    .filter((line) => line !== '' && !line.startsWith('#'));
}

// uvu prints each test file's name on a line of its own, then its results; a failed test's header
// is "FAIL" and the test's name in quotes (a suite's name before it), its message on the next line.
const fileLine = /^\S+\.test\.[cm]?[jt]s$/;
const failHeader = /^\s*FAIL\s+(.*)$/;

/** Keeps uvu's failed tests from a stream of output lines: file, name and message, one entry each (at most `limit`, lines cut at 400 characters). */
export function failureCollector(limit = 40): { line(text: string): void; failures: string[] } {
  const failures: string[] = [];
  let file = '';
  let wantMessage = false;
  return {
    failures,
    line(text: string): void {
      const plain = stripVTControlCharacters(text).trim();
      if (fileLine.test(plain)) {
        file = plain;
        wantMessage = false;
        return;
      }
      const header = failHeader.exec(plain);
      if (header && failures.length < limit) {
        failures.push(`  ${file ? `${file}: ` : ''}FAIL ${header[1]!.slice(0, 400)}`);
        wantMessage = true;
      } else if (wantMessage && plain !== '') {
        failures[failures.length - 1] += `\n    ${plain.slice(0, 400)}`;
        wantMessage = false;
      }
    },
  };
}

/** Runs a command with its output passed through as it comes, and returns its status with the failures uvu reported in it. */
function runEchoingFailures(command: string, cwd: string): Promise<{ status: number | string; failures: string[] }> {
  const collector = failureCollector();
  const child = spawn('bash', ['-c', command], { cwd, stdio: ['inherit', 'pipe', 'pipe'] });
  for (const [stream, out] of [[child.stdout, process.stdout], [child.stderr, process.stderr]] as const) {
    let partial = '';
    stream.on('data', (chunk: Buffer) => {
      out.write(chunk);
      const lines = (partial + chunk.toString('utf8')).split('\n');
      partial = lines.pop()!;
      for (const line of lines) collector.line(line);
    });
    stream.on('end', () => partial && collector.line(partial));
  }
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code, signal) => resolve({ status: code ?? signal ?? 1, failures: collector.failures }));
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const at = process.argv.indexOf('--in');
  const where = at >= 0 ? process.argv[at + 1] : checkout;
  if (!where) throw new Error('--in needs a directory');
  const commands = readmeCommands(readFileSync(join(where, 'README.md'), 'utf8'));
  if (!process.argv.includes('--run')) {
    for (const command of commands) console.log(command);
  } else {
    for (const command of commands) {
      const started = Date.now();
      process.stderr.write(`\n=== README: ${command}\n`);
      const { status, failures } = await runEchoingFailures(command, where);
      process.stderr.write(`=== README: ${command}: exit ${status} in ${((Date.now() - started) / 1000).toFixed(0)} s\n`);
      if (status !== 0) {
        // CI shows the end of its log: after npm test that is the skip list, which says nothing
        // of what failed. The failures' headers and messages, again, where they will be read.
        if (failures.length) process.stderr.write(`=== README: ${command}: what failed\n${failures.join('\n')}\n`);
        process.exit(typeof status === 'number' ? status : 1);
      }
    }
  }
}
