// Pulling an image from a registry over the distribution API (/v2/): resolve the reference to a
// linux/amd64 manifest, check the config's platform, and bring every layer into the blob store,
// verified. Nothing about the image is trusted before its digest is checked: a manifest fetched
// by tag is hashed and kept by that hash, and everything after is fetched by digest.
import { createHash } from 'node:crypto';
import { readFile } from 'node:fs/promises';

import { TorporError } from '../errors.js';
import { torporHome } from '../store/home.js';
import { loadCredentials, RegistryAuth } from './auth.js';
import { BlobStore } from './blob-store.js';
import { checkPlatform, parseImageConfig } from './config.js';
import { documentKind, MEDIA, parseIndex, parseJson, parseManifest, selectLinuxAmd64, type Descriptor } from './manifest.js';
import { parseImageReference, type ImageReference } from './reference.js';
import type { ImageLayer, ImageProgress, PulledImage } from './types.js';

export interface PullOptions {
  /** The torpor home whose images/blobs/ cache receives the blobs (default: torporHome()). */
  home?: string;
  onProgress?: (p: ImageProgress) => void;
  /** Speak http, not https. Default: only for localhost, 127.0.0.1 and ::1. */
  insecure?: boolean;
  signal?: AbortSignal;
  /** Re-hash cached blobs instead of trusting their size. */
  verify?: boolean;
  /** Environment for $DOCKER_CONFIG / $HOME (tests). */
  env?: NodeJS.ProcessEnv;
}

const MANIFEST_ACCEPT = [MEDIA.ociIndex, MEDIA.ociManifest, MEDIA.dockerList, MEDIA.dockerManifest].join(', ');

/** A manifest is a small document; a larger answer is not one (and is not read into memory). */
const MAX_MANIFEST_BYTES = 4 << 20;
const MAX_CONFIG_BYTES = 16 << 20;
const LAYER_CONCURRENCY = 3;

function isLoopback(registry: string): boolean {
  const host = registry.replace(/:\d+$/, '');
  return host === 'localhost' || host === '127.0.0.1' || host === '[::1]' || /^127\./.test(host);
}

// Node's fetch wraps every socket failure as TypeError('fetch failed') with the system error as
// its cause; these are the ones that mean "no registry there".
const UNREACHABLE = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'ECONNRESET', 'EHOSTUNREACH', 'ENETUNREACH', 'ETIMEDOUT', 'UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_SOCKET', 'EPROTO', 'CERT_HAS_EXPIRED', 'DEPTH_ZERO_SELF_SIGNED_CERT', 'SELF_SIGNED_CERT_IN_CHAIN', 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'ERR_SSL_WRONG_VERSION_NUMBER']);

function causeCode(err: unknown): string | undefined {
  for (let e: unknown = err, depth = 0; e && depth < 5; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === 'string') return code;
  }
  return undefined;
}

/** The registry's error codes from an error answer's JSON body ({errors:[{code,message}]}). */
async function errorCodes(res: Response): Promise<{ codes: string[]; text: string }> {
  const text = await res.text().catch(() => '');
  try {
    const errors = (JSON.parse(text) as { errors?: { code?: string; message?: string }[] }).errors ?? [];
    return { codes: errors.map((e) => e.code ?? ''), text: errors.map((e) => `${e.code}: ${e.message}`).join('; ') };
  } catch {
    return { codes: [], text: text.slice(0, 200) };
  }
}

/** Reads a body up to `limit` bytes (a longer one is refused as not what was asked for). */
async function readLimited(res: Response, limit: number, what: string): Promise<Buffer> {
  const declared = Number(res.headers.get('content-length') ?? NaN);
  if (declared > limit) {
    await res.body?.cancel();
    throw new TorporError('IMAGE_INVALID', `${what} is ${declared} bytes, more than the ${limit} torpor reads`);
  }
  const chunks: Buffer[] = [];
  let n = 0;
  if (res.body) {
    for await (const chunk of res.body) {
      n += chunk.length;
      if (n > limit) {
        await res.body.cancel().catch(() => {});
        throw new TorporError('IMAGE_INVALID', `${what} is more than the ${limit} bytes torpor reads`);
      }
      chunks.push(Buffer.from(chunk));
    }
  }
  return Buffer.concat(chunks);
}

/** One registry conversation: base URL, authentication, error mapping. */
class RegistryClient {
  private readonly base: string;
  private readonly scope: string;
  private auth!: RegistryAuth;

  constructor(
    readonly ref: ImageReference,
    private readonly opts: PullOptions,
  ) {
    const insecure = opts.insecure ?? isLoopback(ref.registry);
    this.base = `${insecure ? 'http' : 'https'}://${ref.registry}/v2/${ref.repository}`;
    this.scope = `repository:${ref.repository}:pull`;
  }

  async init(): Promise<void> {
    const creds = await loadCredentials(this.ref.registry, this.opts.env);
    this.auth = new RegistryAuth(this.ref.registry, creds, (url, init) => this.send(url, init));
  }

  /** fetch(), with socket failures as REGISTRY_UNREACHABLE and the caller's abort signal. */
  private async send(url: string, init: RequestInit): Promise<Response> {
    try {
      return await fetch(url, { ...init, redirect: 'follow', ...(this.opts.signal ? { signal: this.opts.signal } : {}) });
    } catch (err) {
      if (this.opts.signal?.aborted) throw this.opts.signal.reason;
      const code = causeCode(err);
      const host = new URL(url).host;
      const hint = code && /CERT|SSL|EPROTO/.test(code) ? ' (a TLS failure: an http-only registry needs insecure: true)' : '';
      throw new TorporError(
        'REGISTRY_UNREACHABLE',
        `cannot reach registry ${host} for ${this.ref.canonical}: ${code ?? (err as Error).message}${hint}`,
        { cause: err },
      );
    }
  }

  private get(path: string, headers: Record<string, string> = {}): Promise<Response> {
    return this.auth.fetch(`${this.base}${path}`, { headers }, this.scope);
  }

  private async failure(res: Response, what: string): Promise<TorporError> {
    const { codes, text } = await errorCodes(res);
    if (res.status === 404 || codes.includes('MANIFEST_UNKNOWN') || codes.includes('NAME_UNKNOWN') || codes.includes('BLOB_UNKNOWN')) {
      return new TorporError('IMAGE_NOT_FOUND', `image ${this.ref.canonical} not found in registry ${this.ref.registry}: ${what} (HTTP ${res.status}${text ? `, ${text}` : ''})`);
    }
    if (res.status === 403 || codes.includes('DENIED') || codes.includes('UNAUTHORIZED')) {
      return new TorporError('REGISTRY_AUTH', `registry ${this.ref.registry} denied access to ${this.ref.canonical} (${what}: HTTP ${res.status}${text ? `, ${text}` : ''})`);
    }
    const code = res.status >= 500 || res.status === 429 ? 'REGISTRY_UNREACHABLE' : 'IMAGE_INVALID';
    return new TorporError(code, `registry ${this.ref.registry} answered HTTP ${res.status} for ${what} of ${this.ref.canonical}${text ? `: ${text}` : ''}`);
  }

  /** A manifest or index by tag or digest: its bytes, its digest (checked when asked by digest). */
  async manifest(reference: string): Promise<{ bytes: Buffer; digest: string; contentType: string }> {
    const res = await this.get(`/manifests/${reference}`, { accept: MANIFEST_ACCEPT });
    if (!res.ok) throw await this.failure(res, `manifest ${reference}`);
    const bytes = await readLimited(res, MAX_MANIFEST_BYTES, `the manifest of ${this.ref.canonical}`);
    const digest = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
    if (reference.startsWith('sha256:') && digest !== reference) {
      throw new TorporError('BLOB_CORRUPT', `manifest ${reference} of ${this.ref.canonical} is corrupt: the registry sent a document hashing to ${digest}`);
    }
    return { bytes, digest, contentType: res.headers.get('content-type') ?? '' };
  }

  /** Opens a blob from `offset` on; error answers become TorporErrors here. */
  async blob(digest: string, offset: number): Promise<Response> {
    const res = await this.get(`/blobs/${digest}`, offset > 0 ? { range: `bytes=${offset}-` } : {});
    if (res.ok || res.status === 416) return res;
    throw await this.failure(res, `blob ${digest}`);
  }
}

export async function pullImage(reference: string, opts: PullOptions = {}): Promise<PulledImage> {
  const ref = parseImageReference(reference);
  const what = ref.canonical;
  const store = new BlobStore(opts.home ?? torporHome(opts.env));
  const client = new RegistryClient(ref, opts);
  await client.init();
  const progress = opts.onProgress;

  progress?.({ phase: 'resolve', message: `resolving ${what}` });
  let doc = await client.manifest(ref.digest ?? ref.tag!);
  let parsed = parseJson(doc.bytes, `the manifest of ${what}`);
  if (documentKind(parsed, doc.contentType) === 'index') {
    await store.putBytes(doc.digest, doc.bytes, what);
    const pick = selectLinuxAmd64(parseIndex(parsed, `the index of ${what}`), `image ${what}`);
    progress?.({ phase: 'resolve', message: `${what}: linux/amd64 is ${pick.digest}` });
    doc = await client.manifest(pick.digest);
    parsed = parseJson(doc.bytes, `the linux/amd64 manifest of ${what}`);
  }
  if (documentKind(parsed, doc.contentType) !== 'manifest') {
    throw new TorporError('IMAGE_INVALID', `${what}: the registry sent a ${(parsed.mediaType as string) ?? doc.contentType ?? 'document'} that is neither an image manifest nor an index (docker schema 1 images are not supported)`);
  }
  const manifest = parseManifest(parsed, `the manifest of ${what}`);
  await store.putBytes(doc.digest, doc.bytes, what);

  const fetchBlob = (d: Descriptor, report: boolean) =>
    store.download({
      digest: d.digest,
      size: d.size,
      image: what,
      open: (offset) => client.blob(d.digest, offset),
      ...(report && progress ? { onProgress: progress } : {}),
      ...(opts.verify ? { verify: true } : {}),
      ...(opts.signal ? { signal: opts.signal } : {}),
    });

  if (manifest.config.size > MAX_CONFIG_BYTES) throw new TorporError('IMAGE_INVALID', `${what}: its config is ${manifest.config.size} bytes`);
  const configPath = (await fetchBlob(manifest.config, false)).path;
  const config = parseImageConfig(await readFile(configPath), what);
  checkPlatform(config, `image ${what}`);

  // A few layers at a time: one stream rarely fills a link to a remote registry, and a layer
  // listed twice (it happens) must not be fetched by two of them at once.
  const unique = [...new Map(manifest.layers.map((l) => [l.digest, l])).values()];
  const paths = new Map<string, string>();
  let next = 0;
  let failed = false;
  const worker = async (): Promise<void> => {
    // After one layer fails no new one starts, and the error waits for those in flight to
    // settle, so nothing is still writing into the store once pullImage has answered.
    while (!failed && next < unique.length) {
      const l = unique[next++]!;
      try {
        paths.set(l.digest, (await fetchBlob(l, true)).path);
      } catch (err) {
        failed = true;
        throw err;
      }
    }
  };
  const settled = await Promise.allSettled(Array.from({ length: Math.min(LAYER_CONCURRENCY, unique.length) }, worker));
  const failure = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
  if (failure) throw failure.reason;
  const layers: ImageLayer[] = manifest.layers.map((l) => ({ digest: l.digest, mediaType: l.mediaType, size: l.size, path: paths.get(l.digest)! }));
  return { source: reference, manifestDigest: doc.digest, configDigest: manifest.config.digest, config, layers };
}
