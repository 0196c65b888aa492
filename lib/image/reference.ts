// Image references as `docker pull` reads them: [registry[:port]/]path[:tag][@digest].
// The registry part is only recognised as one when it looks like a host (has a '.' or a
// ':' or is 'localhost'), because 'user/app' is a Docker Hub repository, not a host 'user'.
import { TorporError } from '../errors.js';

export interface ImageReference {
  /** The host[:port] the API is spoken to ('registry-1.docker.io' for Docker Hub). */
  registry: string;
  /** The repository path inside the registry ('library/node' for 'node'). */
  repository: string;
  /** The tag, when the reference names one ('latest' when it names neither tag nor digest). */
  tag?: string;
  /** 'sha256:<64 hex>' when the reference pins the manifest. */
  digest?: string;
  /** The fully spelled reference: 'docker.io/library/node:22', 'localhost:5000/a/b:t@sha256:...'. */
  canonical: string;
}

/** The host Docker Hub's registry API answers on; 'docker.io' is only its name in config.json. */
export const DOCKER_HUB_REGISTRY = 'registry-1.docker.io';
const DOCKER_HUB_NAMES = new Set(['docker.io', 'index.docker.io', DOCKER_HUB_REGISTRY]);

// The distribution spec's grammar: lower-case path components joined by '/', each a run of
// alphanumerics separated by '.', '_', '__' or dashes; tags up to 128 word characters.
const COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const TAG = /^[\w][\w.-]{0,127}$/;
const DIGEST = /^sha256:[a-f0-9]{64}$/;
// A host name or IPv4 address, or a bracketed IPv6 address, with an optional port.
const HOST = /^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[0-9a-fA-F:.]+\])(?::[0-9]{1,5})?$/;

function invalid(ref: string, why: string): TorporError {
  return new TorporError('INVALID_ARGUMENT', `invalid image reference ${JSON.stringify(ref)}: ${why}`);
}

export function isDockerHub(registry: string): boolean {
  return DOCKER_HUB_NAMES.has(registry);
}

export function parseImageReference(ref: string): ImageReference {
  if (typeof ref !== 'string' || ref.trim() === '') throw invalid(String(ref), 'empty');
  if (ref !== ref.trim() || /\s/.test(ref)) throw invalid(ref, 'contains whitespace');
  let rest = ref;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST.test(digest)) throw invalid(ref, 'the digest must be sha256:<64 lower-case hex digits>');
  }
  // The tag is after the last ':' of the last path component (a ':' before a '/' is a port).
  let tag: string | undefined;
  const lastSlash = rest.lastIndexOf('/');
  const colon = rest.indexOf(':', lastSlash + 1);
  if (colon >= 0) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG.test(tag)) throw invalid(ref, `bad tag ${JSON.stringify(tag)}`);
  }
  let registry = DOCKER_HUB_REGISTRY;
  let path = rest;
  const slash = rest.indexOf('/');
  if (slash >= 0) {
    const first = rest.slice(0, slash);
    if (first.includes('.') || first.includes(':') || first === 'localhost' || first.startsWith('[')) {
      if (!HOST.test(first)) throw invalid(ref, `bad registry host ${JSON.stringify(first)}`);
      registry = first;
      path = rest.slice(slash + 1);
    }
  }
  if (path === '') throw invalid(ref, 'no repository name');
  const components = path.split('/');
  for (const c of components) {
    if (!COMPONENT.test(c)) throw invalid(ref, `bad repository component ${JSON.stringify(c)} (lower-case letters, digits and . _ - only)`);
  }
  const hub = isDockerHub(registry);
  if (hub) {
    registry = DOCKER_HUB_REGISTRY;
    // Docker Hub's official images live under library/: 'node' is 'library/node'.
    if (components.length === 1) path = `library/${path}`;
  }
  if (path.length > 255) throw invalid(ref, 'repository name longer than 255 characters');
  if (tag === undefined && digest === undefined) tag = 'latest';
  const shown = hub ? 'docker.io' : registry;
  const canonical = `${shown}/${path}${tag !== undefined ? `:${tag}` : ''}${digest !== undefined ? `@${digest}` : ''}`;
  const out: ImageReference = { registry, repository: path, canonical };
  if (tag !== undefined) out.tag = tag;
  if (digest !== undefined) out.digest = digest;
  return out;
}
