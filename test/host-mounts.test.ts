// lib/host/mounts.ts: mountinfo's lines as the kernel writes them, optional fields and escapes
// included, and this process's own mounts.
import { test } from 'uvu';
import * as assert from 'uvu/assert';

import { parseMountinfo, readMountsSync } from '../lib/host/mounts.js';

test('mount point, device and type; optional fields, \\ooo escapes and short lines', () => {
  const text = [
    '27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard',
    '45 27 7:0 / /mnt/a\\040b\\134c rw,relatime shared:12 master:3 - ext4 /dev/loop0 rw',
    '46 27 0:25 / /tmp\\011tab rw - tmpfs tmpfs rw',
    '47 27 0:26 / /cut rw',
    'short line',
    '',
  ].join('\n');
  assert.equal(parseMountinfo(text), [
    { point: '/', majorMinor: '254:0', type: 'ext4' },
    { point: '/mnt/a b\\c', majorMinor: '7:0', type: 'ext4' },
    { point: '/tmp\ttab', majorMinor: '0:25', type: 'tmpfs' },
    { point: '/cut', majorMinor: '0:26' },
  ]);
});

test("this process's mounts include / with a type", () => {
  const root = readMountsSync().find((m) => m.point === '/');
  assert.ok(root?.type, JSON.stringify(root));
});

test.run();
