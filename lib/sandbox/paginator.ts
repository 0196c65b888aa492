// Sandbox.list's result, shaped as E2B's paginator (`hasNext`, `nextItems()`) and still what
// torpor's own callers had: awaiting it gives every match as an array, and `for await` walks
// them. The listing is read once, on first use: the sandboxes live in this machine's
// TORPOR_HOME, so a page is a slice, not a request.
import type { SandboxInfo } from './info.js';

export class SandboxPaginator implements PromiseLike<SandboxInfo[]>, AsyncIterable<SandboxInfo> {
  #all: Promise<SandboxInfo[]> | undefined;
  #offset = 0;
  #hasNext = true;

  /** @internal made by Sandbox.list */
  constructor(
    private readonly load: () => Promise<SandboxInfo[]>,
    /** Sandboxes per `nextItems()` page. */
    readonly limit: number,
  ) {}

  #list(): Promise<SandboxInfo[]> {
    this.#all ??= this.load();
    return this.#all;
  }

  /** Whether `nextItems()` has more to give (true before the first page is read). */
  get hasNext(): boolean {
    return this.#hasNext;
  }

  /**
   * The next page of at most `limit` sandboxes (empty once `hasNext` is false).
   * @throws {@link InvalidArgumentError} (INVALID_ARGUMENT) for bad list options.
   */
  async nextItems(): Promise<SandboxInfo[]> {
    const all = await this.#list();
    const page = all.slice(this.#offset, this.#offset + this.limit);
    this.#offset += page.length;
    this.#hasNext = this.#offset < all.length;
    return page;
  }

  /** Every match at once: `await Sandbox.list()` is an array, as before. */
  then<A = SandboxInfo[], B = never>(onfulfilled?: ((all: SandboxInfo[]) => A | PromiseLike<A>) | null, onrejected?: ((reason: unknown) => B | PromiseLike<B>) | null): Promise<A | B> {
    return this.#list().then(onfulfilled, onrejected);
  }

  /** As a promise's: the listing's failure (bad options), for callers that used list() as one. */
  catch<B = never>(onrejected?: ((reason: unknown) => B | PromiseLike<B>) | null): Promise<SandboxInfo[] | B> {
    return this.#list().catch(onrejected);
  }

  async *[Symbol.asyncIterator](): AsyncIterator<SandboxInfo> {
    for (const info of await this.#list()) yield info;
  }
}
