// Registry authentication as docker does it: credentials from the user's docker config.json,
// then the challenge the registry answers a request with. A 401 with a Bearer challenge sends us
// to the named token server (anonymously, or with Basic credentials) for a token scoped to this
// repository; a Basic challenge takes the credentials directly. Tokens are cached per scope for
// the life of one pull, which is all the life they need.
import { readFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join } from 'node:path';

import { TorporError } from '../errors.js';
import { isDockerHub } from './reference.js';

export interface RegistryCredentials {
  username?: string;
  password?: string;
  /** An OAuth2 refresh token (`docker login` to registries that issue them). */
  identityToken?: string;
}

/** The config.json `auths` keys that may hold a registry's entry, most specific first. */
function authKeys(registry: string): string[] {
  if (isDockerHub(registry)) {
    return ['https://index.docker.io/v1/', 'index.docker.io', 'docker.io', 'https://docker.io', 'registry-1.docker.io'];
  }
  return [registry, `https://${registry}`, `http://${registry}`, `https://${registry}/v1/`, `https://${registry}/v2/`];
}

/**
 * The user's credentials for `registry` from $DOCKER_CONFIG/config.json, else
 * ~/.docker/config.json; null when none are stored there. Credential helpers (credsStore,
 * credHelpers) are not run: their entries read as no credentials, so a public image still pulls.
 */
export async function loadCredentials(registry: string, env: NodeJS.ProcessEnv = process.env): Promise<RegistryCredentials | null> {
  const file = join(env.DOCKER_CONFIG || join(env.HOME || homedir(), '.docker'), 'config.json');
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch {
    return null;
  }
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch (err) {
    throw new TorporError('INVALID_ARGUMENT', `${file} is not valid JSON: ${(err as Error).message}`);
  }
  const auths = (doc as { auths?: unknown } | null)?.auths;
  if (typeof auths !== 'object' || auths === null) return null;
  // Keys may carry a trailing slash or path ('https://host/v1/'); compare on the host.
  const entries = new Map<string, unknown>();
  for (const [key, value] of Object.entries(auths)) entries.set(key, value);
  for (const key of authKeys(registry)) {
    const entry = entries.get(key) as { auth?: unknown; username?: unknown; password?: unknown; identitytoken?: unknown } | undefined;
    if (!entry || typeof entry !== 'object') continue;
    const creds: RegistryCredentials = {};
    if (typeof entry.auth === 'string' && entry.auth !== '') {
      const decoded = Buffer.from(entry.auth, 'base64').toString('utf8');
      const colon = decoded.indexOf(':');
      if (colon < 0) throw new TorporError('INVALID_ARGUMENT', `${file}: auths[${JSON.stringify(key)}].auth is not base64 of user:password`);
      creds.username = decoded.slice(0, colon);
      creds.password = decoded.slice(colon + 1);
    } else if (typeof entry.username === 'string' && typeof entry.password === 'string') {
      creds.username = entry.username;
      creds.password = entry.password;
    }
    if (typeof entry.identitytoken === 'string' && entry.identitytoken !== '') creds.identityToken = entry.identitytoken;
    if (creds.username !== undefined || creds.identityToken !== undefined) return creds;
  }
  return null;
}

export interface Challenge {
  scheme: string;
  params: Record<string, string>;
}

/** The challenges of a WWW-Authenticate header ('Bearer realm="...",service="...",scope="..."'). */
export function parseChallenges(header: string): Challenge[] {
  const out: Challenge[] = [];
  // scheme, then comma-separated key=value pairs whose values may be quoted (and contain commas).
  const re = /\s*([A-Za-z][\w-]*)(?:\s+((?:[\w-]+\s*=\s*(?:"(?:[^"\\]|\\.)*"|[^,\s]*)\s*,?\s*)*))?/y;
  let pos = 0;
  while (pos < header.length) {
    re.lastIndex = pos;
    const m = re.exec(header);
    if (!m || m[0] === '') break;
    pos = re.lastIndex;
    const params: Record<string, string> = {};
    const pairs = /([\w-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))/g;
    for (const p of (m[2] ?? '').matchAll(pairs)) params[p[1]!.toLowerCase()] = p[2] !== undefined ? p[2].replace(/\\(.)/g, '$1') : p[3]!;
    out.push({ scheme: m[1]!.toLowerCase(), params });
    while (header[pos] === ',' || header[pos] === ' ') pos++;
  }
  return out;
}

function basic(creds: RegistryCredentials): string {
  return 'Basic ' + Buffer.from(`${creds.username ?? ''}:${creds.password ?? ''}`).toString('base64');
}

/** Sends requests to one registry, answering its challenges. */
export class RegistryAuth {
  private readonly tokens = new Map<string, string>();
  /** What the last challenge asked for, so later requests authenticate up front. */
  private scheme: 'none' | 'basic' | 'bearer' = 'none';

  constructor(
    readonly registry: string,
    private readonly credentials: RegistryCredentials | null,
    private readonly send: (url: string, init: RequestInit) => Promise<Response>,
  ) {}

  private refused(why: string): TorporError {
    const who = this.credentials ? `refused the credentials for ${this.credentials.username ?? 'the identity token'}` : 'needs credentials';
    return new TorporError('REGISTRY_AUTH', `registry ${this.registry} ${who} (${why}); check \`docker login ${this.registry}\` or $DOCKER_CONFIG/config.json`);
  }

  private authorization(scope: string): string | undefined {
    if (this.scheme === 'bearer') {
      const token = this.tokens.get(scope);
      return token === undefined ? undefined : `Bearer ${token}`;
    }
    if (this.scheme === 'basic' && this.credentials?.username !== undefined) return basic(this.credentials);
    return undefined;
  }

  /** GET (or whatever `init` says) `url`, authenticated for `scope` ('repository:name:pull'). */
  async fetch(url: string, init: RequestInit, scope: string): Promise<Response> {
    const attempt = (auth: string | undefined): Promise<Response> => {
      const headers = new Headers(init.headers);
      if (auth) headers.set('authorization', auth);
      return this.send(url, { ...init, headers });
    };
    const first = this.authorization(scope);
    const res = await attempt(first);
    if (res.status !== 401) return res;
    await res.body?.cancel();
    const challenges = parseChallenges(res.headers.get('www-authenticate') ?? '');
    const bearer = challenges.find((c) => c.scheme === 'bearer');
    const basicChallenge = challenges.find((c) => c.scheme === 'basic');
    let auth: string;
    if (bearer) {
      this.scheme = 'bearer';
      // The scope the registry asks for is authoritative (it may add actions); ours is the fallback.
      const token = await this.token(bearer.params, bearer.params.scope ?? scope);
      this.tokens.set(scope, token);
      auth = `Bearer ${token}`;
    } else if (basicChallenge) {
      if (this.credentials?.username === undefined) throw this.refused('it asks for a user name and password');
      this.scheme = 'basic';
      auth = basic(this.credentials);
      if (auth === first) throw this.refused('HTTP 401');
    } else {
      throw this.refused('HTTP 401 with no challenge torpor understands');
    }
    const again = await attempt(auth);
    if (again.status === 401 || again.status === 403) {
      await again.body?.cancel();
      throw this.refused(`HTTP ${again.status} for ${scope}`);
    }
    return again;
  }

  /** A token from the Bearer challenge's realm for `scope`. */
  private async token(params: Record<string, string>, scope: string): Promise<string> {
    const realm = params.realm;
    if (!realm) throw new TorporError('REGISTRY_AUTH', `registry ${this.registry} sent a Bearer challenge without a realm`);
    let res: Response;
    const creds = this.credentials;
    if (creds?.identityToken !== undefined) {
      // docker's OAuth2 flow: the identity token is a refresh token, traded at the realm by POST.
      const form = new URLSearchParams({ grant_type: 'refresh_token', refresh_token: creds.identityToken, client_id: 'torpor', scope });
      if (params.service) form.set('service', params.service);
      res = await this.send(realm, { method: 'POST', body: form, headers: { 'content-type': 'application/x-www-form-urlencoded' } });
    } else {
      const url = new URL(realm);
      if (params.service) url.searchParams.set('service', params.service);
      if (scope) url.searchParams.set('scope', scope);
      const headers: Record<string, string> = {};
      if (creds?.username !== undefined) headers.authorization = basic(creds);
      res = await this.send(url.toString(), { headers });
    }
    if (res.status === 401 || res.status === 403) {
      await res.body?.cancel();
      throw this.refused(`the token server at ${realm} answered HTTP ${res.status}`);
    }
    if (!res.ok) {
      await res.body?.cancel();
      throw new TorporError('REGISTRY_AUTH', `registry ${this.registry}: the token server at ${realm} answered HTTP ${res.status}`);
    }
    const body = (await res.json().catch(() => null)) as { token?: unknown; access_token?: unknown } | null;
    const token = typeof body?.token === 'string' ? body.token : typeof body?.access_token === 'string' ? body.access_token : undefined;
    if (!token) throw new TorporError('REGISTRY_AUTH', `registry ${this.registry}: the token server at ${realm} sent no token`);
    return token;
  }
}
