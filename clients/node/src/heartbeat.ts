// Keeps leases alive while work runs: every `interval` ms, one EXTEND per
// held job (concurrently). A STALE answer means another worker claimed the
// key: the job's lease is marked lost (its signal aborts). A connection
// error is retried at the next beat. The timer runs on the event loop: a
// work that blocks the loop longer than the lease starves it.
import type { Connection } from './connection.js';
import { type Hooks, type Job, type Stats, leaseLost } from './core.js';
import { StaleError } from './errors.js';

export class Heartbeat {
  readonly #held = new Map<Job, string>();
  readonly #timer?: ReturnType<typeof setInterval>;
  #beat?: Promise<unknown>;

  constructor(
    private readonly conn: Connection,
    private readonly lease: number,
    interval: number,
    private readonly stats: Stats,
    private readonly hooks: Hooks,
  ) {
    if (interval > 0) {
      this.#timer = setInterval(() => {
        this.#beat ??= this.#extendAll().finally(() => (this.#beat = undefined));
      }, interval);
      this.#timer.unref?.();
    }
  }

  /** Keeps `job` (stored under `key`) alive until `delete` or `stop`. */
  add(job: Job, key: string): void {
    this.#held.set(job, key);
  }

  delete(job: Job): void {
    this.#held.delete(job);
  }

  async #extendAll(): Promise<void> {
    await Promise.all(
      [...this.#held].map(async ([job, key]) => {
        if (job.lost) return;
        try {
          await this.conn.extend(key, job.token, this.lease);
          this.stats.extends++;
        } catch (err) {
          if (err instanceof StaleError && this.#held.has(job)) leaseLost(job, err, this.stats, this.hooks);
        }
      }),
    );
  }

  /** Stops the timer and waits for an EXTEND in flight. */
  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    this.#held.clear();
    await this.#beat;
  }
}
