// The README's "Contributing" commands, read from the README itself, so CI runs exactly what a
// newcomer is told to run and the two cannot drift apart.
//   node --import tsx test/readme-commands.ts          prints them, one a line
//   node --import tsx test/readme-commands.ts --run    runs them in order in the checkout; stops at the first failure
//   ... --run --in DIR                                  runs the README of the checkout at DIR, in DIR (.ci/run's fresh clone,
//                                                       where nothing is installed yet, so this script runs from another checkout)
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

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
      const r = spawnSync('bash', ['-c', command], { cwd: where, stdio: 'inherit' });
      process.stderr.write(`=== README: ${command}: exit ${r.status ?? r.signal} in ${((Date.now() - started) / 1000).toFixed(0)} s\n`);
      if (r.status !== 0) process.exit(r.status ?? 1);
    }
  }
}
