// Keeps leases alive while work runs, on the instance's one clock: a job
// held longer than its heartbeat interval gets an EXTEND, then again every
// interval until it is let go. A STALE answer means another worker claimed
// the key: the job's lease is marked lost (its signal aborts). A connection
// error is tried again at the next beat. The clock runs on the event loop:
// a work that blocks the loop longer than the lease starves it.
import type { Clock, Timed } from './clock.js';
import type { Connection } from './connection.js';
import { type Hooks, type Job, type Stats, holdLease, leaseLost } from './core.js';
import { StaleError } from './errors.js';

/** One job's beats. */
class Beat implements Timed {
  due = 0;
  cancelled = false;
  held = true;
  extending: Promise<void> | undefined;

  constructor(
    private readonly heartbeat: Heartbeat,
    readonly job: Job,
    readonly key: string,
    readonly lease: number,
    readonly interval: number,
  ) {}

  fire(): void {
    if (!this.held || this.job.lost) return;
    this.extending = this.heartbeat.extend(this).finally(() => {
      this.extending = undefined;
      if (this.held && !this.job.lost) this.heartbeat.clock.add(this, this.interval);
    });
  }
}

export type { Beat };

export class Heartbeat {
  constructor(
    private readonly conn: Connection,
    readonly clock: Clock,
    private readonly stats: Stats,
    private readonly hooks: Hooks,
  ) {}

  /** Keeps `job` (stored under `key`) alive every `interval` ms until `stop`; undefined when `interval` is 0. */
  start(job: Job, key: string, lease: number, interval: number): Beat | undefined {
    if (!(interval > 0)) return undefined;
    const beat = new Beat(this, job, key, lease, interval);
    this.clock.add(beat, interval);
    return beat;
  }

  async extend(beat: Beat): Promise<void> {
    try {
      const sent = performance.now();
      await this.conn.extend(beat.key, beat.job.token, beat.lease);
      holdLease(beat.job, sent + beat.lease);
      this.stats.extends++;
    } catch (err) {
      if (err instanceof StaleError && beat.held) leaseLost(beat.job, err, this.stats, this.hooks);
    }
  }

  /** Lets the job go, and waits for an EXTEND in flight (an EXTEND after a RELEASE would take the key for lost). */
  stop(beat: Beat | undefined): Promise<void> | undefined {
    if (beat === undefined) return undefined;
    beat.held = false;
    beat.cancelled = true;
    return beat.extending;
  }
}
