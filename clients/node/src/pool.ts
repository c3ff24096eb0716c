// Connections for IDEM.CLAIM ... WAIT. A waiting command blocks its
// connection, as BLPOP does, so every command queued behind it on a shared
// connection would wait too (the holder's own DONE among them, which is what
// the waiter waits for). Each wait therefore runs on a duplicate of the
// user's client, taken from a small pool; an idle duplicate is closed after
// `idleMs`, and Idem.close() closes them all.

export interface Duplicate<C> {
  client: C;
  timer?: ReturnType<typeof setTimeout>;
}

export class WaitPool<C> {
  #idle: Duplicate<C>[] = [];
  #open = new Set<C>();

  constructor(
    private readonly create: () => Promise<C>,
    private readonly destroy: (client: C) => Promise<unknown>,
    private readonly maxIdle = 8,
    private readonly idleMs = 10000,
  ) {}

  async use<T>(fn: (client: C) => Promise<T>): Promise<T> {
    const reused = this.#idle.pop();
    if (reused?.timer) clearTimeout(reused.timer);
    const client = reused ? reused.client : await this.create();
    this.#open.add(client);
    let healthy = true;
    try {
      return await fn(client);
    } catch (err) {
      // An error reply leaves the connection usable; a broken one is dropped,
      // and so is one on a server that is no longer the primary (a failover).
      healthy = err instanceof Error && /^[A-Z]+ /.test(err.message) && !/^(READONLY|MASTERDOWN|LOADING)\b/.test(err.message);
      throw err;
    } finally {
      if (healthy && this.#idle.length < this.maxIdle) {
        const entry: Duplicate<C> = { client };
        entry.timer = setTimeout(() => {
          this.#idle = this.#idle.filter((d) => d !== entry);
          this.#close(client);
        }, this.idleMs);
        entry.timer.unref?.();
        this.#idle.push(entry);
      } else this.#close(client);
    }
  }

  #close(client: C): void {
    this.#open.delete(client);
    this.destroy(client).catch(() => undefined);
  }

  /** Closes every duplicate (those in use end their command with an error). */
  async close(): Promise<void> {
    for (const d of this.#idle) if (d.timer) clearTimeout(d.timer);
    this.#idle = [];
    const all = [...this.#open];
    this.#open.clear();
    await Promise.all(all.map((c) => this.destroy(c).catch(() => undefined)));
  }
}
