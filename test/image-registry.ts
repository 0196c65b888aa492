// Test support for lib/image: a real registry (Debian's docker-registry, the distribution
// project's server) started per test file on 127.0.0.1 with its own storage, an in-process token
// server for its `auth: token` mode, a counting proxy, and a push helper that builds images from
// small tarballs and uploads them over the distribution API.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash, sign } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { createServer, request as httpRequest, type IncomingMessage, type Server } from 'node:http';
import { createServer as createNetServer } from 'node:net';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';

import * as tar from 'tar-stream';

/** Why the registry tests cannot run here (a program missing), or null. */
export function needsPrograms(...programs: string[]): string | null {
  const missing = programs.filter((p) => spawnSync('sh', ['-c', `command -v ${p}`], { stdio: 'ignore' }).status !== 0);
  return missing.length ? `needs ${missing.join(' and ')} (apt-get install docker-registry apache2-utils openssl skopeo)` : null;
}

export function sha256(bytes: Buffer | string): string {
  return `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
}

export async function freePort(): Promise<number> {
  const srv = createNetServer();
  await new Promise<void>((ok) => srv.listen(0, '127.0.0.1', ok));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((ok) => srv.close(() => ok()));
  return port;
}

async function listen(server: Server): Promise<number> {
  await new Promise<void>((ok) => server.listen(0, '127.0.0.1', ok));
  return (server.address() as { port: number }).port;
}

export async function closeServer(server: Server): Promise<void> {
  server.closeAllConnections();
  await new Promise<void>((ok) => server.close(() => ok()));
}

// ---- images -------------------------------------------------------------------------------

/** A tar of the given files (content strings or bytes), written by tar-stream. */
export async function makeTar(files: Record<string, string | Buffer>): Promise<Buffer> {
  const pack = tar.pack();
  const chunks: Buffer[] = [];
  pack.on('data', (c: unknown) => chunks.push(c as Buffer));
  const done = new Promise<void>((ok) => pack.on('end', () => ok()));
  for (const [name, content] of Object.entries(files)) {
    pack.entry({ name, mode: 0o644, mtime: new Date(0) }, typeof content === 'string' ? Buffer.from(content) : content);
  }
  pack.finalize();
  await done;
  return Buffer.concat(chunks);
}

export interface Blob {
  mediaType: string;
  bytes: Buffer;
  digest: string;
}

export function blob(mediaType: string, bytes: Buffer): Blob {
  return { mediaType, bytes, digest: sha256(bytes) };
}

export async function gzLayer(files: Record<string, string | Buffer>): Promise<Blob> {
  return blob('application/vnd.oci.image.layer.v1.tar+gzip', gzipSync(await makeTar(files)));
}

export interface TestImage {
  config: Blob;
  layers: Blob[];
  manifest: Blob;
}

export function makeImage(layers: Blob[], cfg: { architecture?: string; os?: string; env?: string[]; cmd?: string[] } = {}): TestImage {
  const configDoc = {
    architecture: cfg.architecture ?? 'amd64',
    os: cfg.os ?? 'linux',
    config: { Env: cfg.env ?? ['PATH=/usr/bin:/bin'], Cmd: cfg.cmd ?? ['/bin/sh'], WorkingDir: '/', User: '' },
    rootfs: { type: 'layers', diff_ids: layers.map((l) => l.digest) },
  };
  const config = blob('application/vnd.oci.image.config.v1+json', Buffer.from(JSON.stringify(configDoc)));
  const manifestDoc = {
    schemaVersion: 2,
    mediaType: 'application/vnd.oci.image.manifest.v1+json',
    config: { mediaType: config.mediaType, digest: config.digest, size: config.bytes.length },
    layers: layers.map((l) => ({ mediaType: l.mediaType, digest: l.digest, size: l.bytes.length })),
  };
  return { config, layers, manifest: blob(manifestDoc.mediaType, Buffer.from(JSON.stringify(manifestDoc))) };
}

export function makeIndex(entries: { image: TestImage; architecture: string; os?: string }[], docker = false): Blob {
  const mediaType = docker ? 'application/vnd.docker.distribution.manifest.list.v2+json' : 'application/vnd.oci.image.index.v1+json';
  const doc = {
    schemaVersion: 2,
    mediaType,
    manifests: entries.map((e) => ({
      mediaType: e.image.manifest.mediaType,
      digest: e.image.manifest.digest,
      size: e.image.manifest.bytes.length,
      platform: { os: e.os ?? 'linux', architecture: e.architecture },
    })),
  };
  return blob(mediaType, Buffer.from(JSON.stringify(doc)));
}

// ---- pushing --------------------------------------------------------------------------------

export class Pusher {
  constructor(
    readonly host: string,
    private readonly authorization?: (repo: string) => Promise<string | undefined>,
  ) {}

  private async headers(repo: string, extra: Record<string, string> = {}): Promise<Record<string, string>> {
    const auth = await this.authorization?.(repo);
    return auth ? { ...extra, authorization: auth } : extra;
  }

  async blob(repo: string, b: Blob): Promise<void> {
    const start = await fetch(`http://${this.host}/v2/${repo}/blobs/uploads/`, { method: 'POST', headers: await this.headers(repo) });
    if (start.status !== 202) throw new Error(`upload start for ${repo}: HTTP ${start.status} ${await start.text()}`);
    const location = new URL(start.headers.get('location')!, `http://${this.host}`);
    location.searchParams.set('digest', b.digest);
    const put = await fetch(location, {
      method: 'PUT',
      body: b.bytes,
      headers: await this.headers(repo, { 'content-type': 'application/octet-stream' }),
    });
    if (put.status !== 201) throw new Error(`upload of ${b.digest}: HTTP ${put.status} ${await put.text()}`);
  }

  async manifest(repo: string, reference: string, m: Blob): Promise<void> {
    const res = await fetch(`http://${this.host}/v2/${repo}/manifests/${reference}`, {
      method: 'PUT',
      body: m.bytes,
      headers: await this.headers(repo, { 'content-type': m.mediaType }),
    });
    if (res.status !== 201) throw new Error(`manifest ${repo}:${reference}: HTTP ${res.status} ${await res.text()}`);
  }

  /** Pushes an image's blobs and its manifest under `tag`. */
  async image(repo: string, tag: string, img: TestImage): Promise<void> {
    for (const l of img.layers) await this.blob(repo, l);
    await this.blob(repo, img.config);
    await this.manifest(repo, tag, img.manifest);
  }

  /** Pushes each image by digest, then the index under `tag`. */
  async index(repo: string, tag: string, images: TestImage[], index: Blob): Promise<void> {
    for (const img of images) await this.image(repo, img.manifest.digest, img);
    await this.manifest(repo, tag, index);
  }
}

// ---- the registry ---------------------------------------------------------------------------

export interface RegistryAuthConfig {
  htpasswd?: string;
  token?: { realm: string; service: string; issuer: string; rootCertBundle: string };
}

export interface TestRegistry {
  host: string;
  storage: string;
  /** The path of the data file of a blob in the registry's storage. */
  blobData(digest: string): string;
  stop(): Promise<void>;
}

export async function startRegistry(dir: string, auth: RegistryAuthConfig = {}): Promise<TestRegistry> {
  const storage = join(dir, 'storage');
  await mkdir(storage, { recursive: true });
  const port = await freePort();
  let authYaml = '';
  if (auth.htpasswd) authYaml = `auth:\n  htpasswd:\n    realm: test-realm\n    path: ${auth.htpasswd}\n`;
  if (auth.token) {
    const t = auth.token;
    authYaml = `auth:\n  token:\n    realm: ${t.realm}\n    service: ${t.service}\n    issuer: ${t.issuer}\n    rootcertbundle: ${t.rootCertBundle}\n`;
  }
  // No blob descriptor cache: a test that damages a blob's data file must see the registry serve it.
  const config = `version: 0.1
log:
  level: info
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: ${storage}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:${port}
  secret: torpor-test-secret
${authYaml}`;
  const configFile = join(dir, 'config.yml');
  await writeFile(configFile, config);
  const log = createWriteStream(join(dir, 'registry.log'));
  const child: ChildProcess = spawn('docker-registry', ['serve', configFile], { stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout!.pipe(log);
  child.stderr!.pipe(log);
  const exited = new Promise<void>((ok) => child.once('exit', () => ok()));
  const host = `127.0.0.1:${port}`;
  const deadline = Date.now() + 20_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`docker-registry exited: ${await readFile(join(dir, 'registry.log'), 'utf8')}`);
    const res = await fetch(`http://${host}/v2/`).catch(() => null);
    if (res && (res.status === 200 || res.status === 401)) break;
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error('docker-registry did not answer /v2/ within 20 s');
    }
    await new Promise((ok) => setTimeout(ok, 50));
  }
  return {
    host,
    storage,
    blobData: (digest) => {
      const hex = digest.slice('sha256:'.length);
      return join(storage, 'docker', 'registry', 'v2', 'blobs', 'sha256', hex.slice(0, 2), hex, 'data');
    },
    stop: async () => {
      if (child.exitCode === null) {
        child.kill('SIGTERM');
        await exited;
      }
    },
  };
}

// ---- a counting proxy -------------------------------------------------------------------------

export interface ProxyRecord {
  method: string;
  path: string;
  range?: string;
  status: number;
}

/**
 * An HTTP proxy (as a stand-in registry host) in front of `target`, recording every request.
 * `cut`: the next whole-blob GET of that digest is cut off (the socket destroyed) after that
 * many bytes of body, as a dropped connection would leave it.
 */
export async function startProxy(
  target: string,
): Promise<{ host: string; log: ProxyRecord[]; cut: { digest?: string; after?: number }; ignoreRange: { on: boolean }; stop(): Promise<void> }> {
  const log: ProxyRecord[] = [];
  const cut: { digest?: string; after?: number } = {};
  // A server that does not do ranges: the Range header is dropped, so the answer is a 200.
  const ignoreRange = { on: false };
  const [thost, tport] = target.split(':');
  const server = createServer((req, res) => {
    const headers = { ...req.headers, host: target };
    if (ignoreRange.on) delete headers.range;
    const upstream = httpRequest(
      { host: thost, port: Number(tport), method: req.method, path: req.url, headers },
      (up: IncomingMessage) => {
        const rec: ProxyRecord = { method: req.method!, path: req.url!, status: up.statusCode! };
        if (req.headers.range) rec.range = req.headers.range;
        log.push(rec);
        res.writeHead(up.statusCode!, up.headers);
        if (cut.digest && cut.after !== undefined && req.url!.endsWith(`/blobs/${cut.digest}`) && !req.headers.range && up.statusCode === 200) {
          let left = cut.after;
          delete cut.digest;
          up.on('data', (chunk: Buffer) => {
            if (left <= 0) return;
            const part = chunk.subarray(0, left);
            left -= part.length;
            res.write(part, () => {
              if (left <= 0) {
                up.destroy();
                res.socket?.destroy();
              }
            });
          });
          return;
        }
        up.pipe(res);
      },
    );
    upstream.on('error', () => res.destroy());
    req.pipe(upstream);
  });
  const port = await listen(server);
  return { host: `127.0.0.1:${port}`, log, cut, ignoreRange, stop: () => closeServer(server) };
}

// ---- the token server -------------------------------------------------------------------------

export interface TokenServer {
  realm: string;
  service: string;
  issuer: string;
  /** Requests it answered: user ('' anonymous) and whether it granted a token. */
  log: { user: string; granted: boolean; scope: string }[];
  stop(): Promise<void>;
}

function b64url(data: Buffer | string): string {
  return Buffer.from(data).toString('base64url');
}

/**
 * The token service a registry in `auth: token` mode sends clients to: Basic credentials from
 * `users` get pull and push; anonymous callers get pull when `anonymousPull`; wrong passwords get
 * 401. Tokens are RS256 JWTs whose x5c header carries the (self-signed) certificate the
 * registry's rootcertbundle trusts.
 */
export async function startTokenServer(
  keyPem: string,
  certPem: string,
  users: Record<string, string>,
  anonymousPull: boolean,
): Promise<TokenServer> {
  const service = 'torpor-test-registry';
  const issuer = 'torpor-test-issuer';
  const der = Buffer.from(certPem.replace(/-----[^-]+-----/g, '').replace(/\s+/g, ''), 'base64');
  const log: TokenServer['log'] = [];
  const server = createServer((req, res) => {
    const url = new URL(req.url!, 'http://x');
    const scope = url.searchParams.get('scope') ?? '';
    let user = '';
    const auth = req.headers.authorization;
    if (auth?.startsWith('Basic ')) {
      const [u, p] = Buffer.from(auth.slice(6), 'base64').toString().split(':');
      if (users[u!] === undefined || users[u!] !== p) {
        log.push({ user: u!, granted: false, scope });
        res.writeHead(401, { 'content-type': 'application/json' }).end('{"details":"bad credentials"}');
        return;
      }
      user = u!;
    }
    const access: { type: string; name: string; actions: string[] }[] = [];
    const m = /^repository:([^:]+):(.*)$/.exec(scope);
    if (m && (user !== '' || anonymousPull)) {
      const asked = m[2]!.split(',');
      const allowed = user !== '' ? ['pull', 'push'] : ['pull'];
      access.push({ type: 'repository', name: m[1]!, actions: asked.filter((a) => allowed.includes(a)) });
    }
    const now = Math.floor(Date.now() / 1000);
    const header = { alg: 'RS256', typ: 'JWT', x5c: [der.toString('base64')] };
    const claims = { iss: issuer, sub: user, aud: service, exp: now + 300, nbf: now - 10, iat: now, jti: String(Math.random()), access };
    const signingInput = `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(claims))}`;
    const signature = sign('sha256', Buffer.from(signingInput), keyPem);
    log.push({ user, granted: true, scope });
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ token: `${signingInput}.${b64url(signature)}`, expires_in: 300 }));
  });
  const port = await listen(server);
  return { realm: `http://127.0.0.1:${port}/token`, service, issuer, log, stop: () => closeServer(server) };
}

/** A self-signed RSA certificate and its key (openssl), for the token server and the registry. */
export function makeCertificate(dir: string): { key: string; cert: string } {
  const key = join(dir, 'token.key');
  const cert = join(dir, 'token.crt');
  const r = spawnSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key, '-out', cert, '-days', '2', '-subj', '/CN=torpor-test-token'], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`openssl: ${r.stderr}`);
  return { key, cert };
}

/** An htpasswd file (bcrypt, which is all the registry reads) made with htpasswd -B. */
export function makeHtpasswd(file: string, user: string, password: string): void {
  const r = spawnSync('htpasswd', ['-B', '-b', '-c', file, user, password], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`htpasswd: ${r.stderr}`);
}

/** A DOCKER_CONFIG directory whose config.json holds `auths[host]` for user:password. */
export async function dockerConfig(dir: string, entries: Record<string, { user: string; password: string }>): Promise<string> {
  await mkdir(dir, { recursive: true });
  const auths: Record<string, { auth: string }> = {};
  for (const [host, e] of Object.entries(entries)) auths[host] = { auth: Buffer.from(`${e.user}:${e.password}`).toString('base64') };
  await writeFile(join(dir, 'config.json'), JSON.stringify({ auths, credsStore: 'desktop' }));
  return dir;
}
