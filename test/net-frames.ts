// Ethernet frames and QEMU's stream protocol for the network tests and bench/net.ts: what the
// virtio-net device sends passt, built by hand, and a connected Unix socket pair to carry it.
import { mkdtempSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { GUEST_NET } from '../lib/net/options.js';

export const GUEST_MAC = Buffer.from([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);

export function ipBytes(a: string): Buffer {
  return Buffer.from(a.split('.').map(Number));
}

export function arpRequest(): Buffer {
  const f = Buffer.alloc(42);
  f.fill(0xff, 0, 6);
  GUEST_MAC.copy(f, 6);
  f.writeUInt16BE(0x0806, 12);
  f.writeUInt16BE(1, 14); // Ethernet
  f.writeUInt16BE(0x0800, 16); // IPv4
  f[18] = 6;
  f[19] = 4;
  f.writeUInt16BE(1, 20); // request
  GUEST_MAC.copy(f, 22);
  ipBytes(GUEST_NET.address).copy(f, 28);
  ipBytes(GUEST_NET.gateway).copy(f, 38);
  return f;
}

export function framed(f: Buffer): Buffer {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(f.length);
  return Buffer.concat([len, f]);
}

/** A connected pair of Unix stream sockets: [ours, the end passt gets]. */
export async function socketPair(): Promise<[net.Socket, net.Socket]> {
  const path = join(mkdtempSync(join(tmpdir(), 'torpor-net-')), 's');
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(path, r));
  const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
  const ours = net.connect(path);
  await new Promise<void>((r) => ours.once('connect', () => r()));
  const theirs = await accepted;
  server.close();
  return [ours, theirs];
}

/** Reads stream-protocol frames until `match` accepts one. */
export function nextFrame(sock: net.Socket, match: (f: Buffer) => boolean, timeoutMs = 5000): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    let buf = Buffer.alloc(0);
    const timer = setTimeout(() => done(new Error('no matching frame from passt')), timeoutMs);
    const onData = (d: Buffer) => {
      buf = Buffer.concat([buf, d]);
      while (buf.length >= 4 && buf.length >= 4 + buf.readUInt32BE(0)) {
        const f = buf.subarray(4, 4 + buf.readUInt32BE(0));
        buf = buf.subarray(4 + f.length);
        if (match(f)) return done(undefined, f);
      }
    };
    const done = (err?: Error, f?: Buffer) => {
      clearTimeout(timer);
      sock.off('data', onData);
      if (err) reject(err);
      else resolve(f!);
    };
    sock.on('data', onData);
  });
}

