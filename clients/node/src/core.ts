// The consumer loop's decisions, without I/O (docs/clients.md, "What
// process(key, work) does"): the counters, the job, what each claim answer
// means, which failures a claim is sent again after, how a result is
// encoded, what a DONE answer means, what WAIT's answer means with
// `durable`, how a completion is reported, and how a batch is cut into
// calls. loop.ts and many.ts only send what this decides; settings.ts
// holds the settings.
import calculateSlot from 'cluster-key-slot';
import type { Codec } from './codec.js';
import {
  BusyError,
  DeadlineError,
  ExhaustedError,
  HookError,
  IdemReplyError,
  LeaseLostError,
  MismatchError,
  NotDurableError,
  ResultNotStoredError,
  ResultTooLargeError,
  StaleError,
  isReplyError,
} from './errors.js';
import type { DurableSettings } from './settings.js';
import type { Bytes, ClaimReply, DoneReply, Edition, GrantedStatus, RecordInfo } from './types.js';

/** What process() and processMany() did, per instance (docs/clients.md's counters). */
export interface Stats {
  /** claims granted NEW */
  firstRuns: number;
  /** claims granted RETRY or SEEN */
  retries: number;
  /** calls answered with a stored completion, after a wait too */
  replays: number;
  /** calls that met a busy key and waited: once per call */
  waits: number;
  /** calls (or batch keys) that ended busy */
  busy: number;
  /** this worker's completions recorded by DONE */
  completed: number;
  /** claims given back after a failed work or hook (a RELEASE answered 1) */
  released: number;
  /** leases found lost (by a heartbeat or by DONE), once per job */
  leasesLost: number;
  /** completions recorded without their result */
  resultsDropped: number;
  mismatches: number;
  exhausted: number;
  /** heartbeat extensions that succeeded */
  extends: number;
  /** calls (or batch keys) that ended NotDurable */
  notDurable: number;
}

export const newStats = (): Stats => ({
  firstRuns: 0,
  retries: 0,
  replays: 0,
  waits: 0,
  busy: 0,
  completed: 0,
  released: 0,
  leasesLost: 0,
  resultsDropped: 0,
  mismatches: 0,
  exhausted: 0,
  extends: 0,
  notDurable: 0,
});

/** Why a completion was recorded without its result. */
export type DropReason = 'oversize' | 'unserializable' | 'memory';

/**
 * Called as the loop goes. `onRun` and `onDone` throwing is a HookError
 * (before the work: the claim is released; after it: the record stays
 * completed); what the others throw is ignored.
 */
export interface Hooks {
  onRun?(job: Job): void | Promise<void>;
  onReplay?(key: string, attempt: number): void;
  onBusy?(key: string, leaseLeft: number): void;
  onDone?(job: Job, resultStored: boolean): void | Promise<void>;
  onRelease?(job: Job, error: unknown): void;
  onLeaseLost?(job: Job): void;
  onResultDropped?(job: Job, reason: DropReason): void;
}

/** Calls one of the hooks whose errors are ignored. */
export function notify<K extends Exclude<keyof Hooks, 'onRun' | 'onDone'>>(hooks: Hooks, name: K, ...args: Parameters<NonNullable<Hooks[K]>>): void {
  const hook = hooks[name] as ((...a: unknown[]) => void) | undefined;
  if (hook === undefined) return;
  try {
    hook(...args);
  } catch {
    // ignored: the outcome is settled already
  }
}

const lostReasons = new WeakMap<Job, Error>();
const controllers = new WeakMap<Job, AbortController>();
/** performance.now() until which the job's lease is known held: the claim's (or latest EXTEND's) send time plus the lease. */
const heldUntil = new WeakMap<Job, number>();

/** One claimed key, given to the work. */
export class Job {
  constructor(
    /** the key as the caller gave it (without the instance's prefix) */
    readonly key: string,
    /** the fencing number: pass it to your writes downstream */
    readonly attempt: number,
    /** how the claim was granted: NEW, RETRY (an earlier try may have partly run) or SEEN (the BLOOM filter may have seen it complete) */
    readonly status: GrantedStatus,
    /** the claim's token (for the typed commands) */
    readonly token: string,
  ) {}

  /** true once the lease is known lost (another worker claimed the key) */
  get lost(): boolean {
    return lostReasons.has(this);
  }

  /** aborted when the lease is lost (made on first use: a job whose work never looks costs nothing) */
  get signal(): AbortSignal {
    let controller = controllers.get(this);
    if (!controller) {
      controllers.set(this, (controller = new AbortController()));
      const reason = lostReasons.get(this);
      if (reason) controller.abort(reason);
    }
    return controller.signal;
  }

  /**
   * Throws LeaseLostError unless the lease is known held: not found lost,
   * and not past the time the claim (or the latest EXTEND that succeeded)
   * was sent plus the lease. Call it right before an effect that the store
   * it goes to cannot fence with `attempt`: a process paused (a stop, a
   * long GC) past its lease learns it here, before the heartbeat's next
   * EXTEND or DONE would tell it.
   */
  check(): void {
    const lost = lostReasons.get(this);
    if (lost) throw lost;
    const until = heldUntil.get(this);
    if (until !== undefined && performance.now() > until) throw new LeaseLostError(this.key, this.attempt);
  }
}

/** The job's lease is held until `until` (performance.now()): a claim or EXTEND sent then plus the lease; never moved back. */
export function holdLease(job: Job, until: number): void {
  if (!(until <= (heldUntil.get(job) ?? -Infinity))) heldUntil.set(job, until);
}

/** Marks the job's lease lost; true the first time (count it then). */
export function loseLease(job: Job, reason: Error): boolean {
  if (lostReasons.has(job)) return false;
  lostReasons.set(job, reason);
  controllers.get(job)?.abort(reason);
  return true;
}

/** Why the job's lease was lost (a LeaseLostError), once it is. */
export const lostReason = (job: Job): Error | undefined => lostReasons.get(job);

/** The job's lease found lost (by a heartbeat or by DONE): marked, counted and told once; the error for the caller. */
export function leaseLost(job: Job, cause: unknown, stats: Stats, hooks: Hooks): LeaseLostError {
  const error = new LeaseLostError(job.key, job.attempt, { cause });
  if (loseLease(job, error)) {
    stats.leasesLost++;
    notify(hooks, 'onLeaseLost', job);
    return error;
  }
  return (lostReason(job) as LeaseLostError | undefined) ?? error;
}

/** The server's WAIT takes at most an hour: a longer wait goes in pieces. */
export const MAX_WAIT_PIECE = 3600000;

/** What the loop does next, after a claim's answer. */
export type ClaimStep =
  | { next: 'claim'; pause: number }
  | { next: 'run'; job: Job }
  | { next: 'replay'; attempt: number; result: Buffer | null }
  | { next: 'busy'; attempt: number; leaseLeft: number }
  | { next: 'throw'; error: Error };

// Answers that wrote nothing and come from a failover, a resharding or a
// restart, or a primary cut from its replicas (NOREPLICAS): the claim is sent again (to the new primary, which the client finds).
const RESEND = /^(TRYAGAIN|UNBLOCKED|READONLY|MASTERDOWN|LOADING|NOREPLICAS|CLUSTERDOWN)\b/;
const CONNECTION = /connection|socket|closed|ECONN|EPIPE|ETIMEDOUT|EHOSTUNREACH|timed out|timeout|refresh slots|reconnect|Sentinel/i;

/** A failure of the connection (not an answer of the server, nor a bug of the caller's). */
export function isConnectionError(err: unknown): boolean {
  if (!(err instanceof Error) || isReplyError(err) || err instanceof TypeError || err instanceof RangeError) return false;
  return CONNECTION.test(err.message) || CONNECTION.test(err.name) || typeof (err as { code?: unknown }).code === 'string';
}

/** A claim that failed this way wrote nothing the caller can use: send it again while time is left. */
export const claimResendable = (err: unknown): boolean =>
  err instanceof IdemReplyError ? RESEND.test(err.message) : isConnectionError(err);

/** 10 ms doubling to 1 s, jittered: polling on the Functions edition, and resends. */
class Backoff {
  #next = 10;
  pause(cap: number): number {
    const jittered = this.#next * (0.75 + Math.random() / 2);
    this.#next = Math.min(this.#next * 2, 1000);
    return Math.max(1, Math.min(jittered, cap));
  }
}

/**
 * One call's claims after the first answered BUSY or failed: WAIT for the
 * time left on the module (in pieces of at most `piece` ms), polling on
 * the Functions edition (never past the holder's lease end nor the
 * deadline). A claim that wrote nothing (claimResendable) is sent again
 * while time is left, and a few times past it.
 */
export class ClaimLoop {
  readonly #deadline: number;
  #waited = false;
  #busySeen = false;
  #resent = 0;
  readonly #poll = new Backoff();
  readonly #resend = new Backoff();

  constructor(
    readonly edition: Edition,
    wait: number,
    private readonly stats: Stats,
    private readonly hooks: Hooks,
    private readonly piece = MAX_WAIT_PIECE,
  ) {
    this.#deadline = Date.now() + wait;
  }

  get waited(): boolean {
    return this.#waited;
  }

  #left(): number {
    return Math.max(0, Math.ceil(this.#deadline - Date.now()));
  }

  /** The WAIT of the next claim (undefined: none). */
  wait(): number | undefined {
    const left = this.#left();
    return this.#waited && this.edition === 'module' && left > 0 ? Math.min(left, this.piece) : undefined;
  }

  onError(err: unknown): ClaimStep {
    // Past the deadline the next claim has no WAIT and answers at once; a
    // few such resends bound a server that keeps refusing.
    if (claimResendable(err)) {
      const left = this.#left();
      if (left > 0 || this.#resent++ < 3) return { next: 'claim', pause: this.#resend.pause(Math.max(left, 10)) };
    }
    return { next: 'throw', error: err instanceof Error ? err : new Error(String(err)) };
  }

  onReply(reply: ClaimReply, keyAsGiven: string): ClaimStep {
    if (reply.status !== 'BUSY') return claimed(reply, keyAsGiven, this.stats, this.hooks);
    if (!this.#busySeen) {
      this.#busySeen = true;
      notify(this.hooks, 'onBusy', keyAsGiven, reply.leaseLeft);
    }
    const left = this.#left();
    if (left <= 0) {
      this.stats.busy++;
      return { next: 'busy', attempt: reply.attempt, leaseLeft: reply.leaseLeft };
    }
    if (!this.#waited) {
      this.#waited = true;
      this.stats.waits++;
    }
    if (this.edition === 'module') return { next: 'claim', pause: 0 }; // with WAIT, see wait()
    return { next: 'claim', pause: this.#poll.pause(Math.min(left, reply.leaseLeft)) };
  }
}

/** A replay handed to the caller: counted, and onReplay told. */
export function countReplay(key: string, attempt: number, stats: Stats, hooks: Hooks): void {
  stats.replays++;
  notify(hooks, 'onReplay', key, attempt);
}

/** A claim's answer other than BUSY, counted (process() and processMany() alike; a replay by countReplay). */
export function claimed(reply: Exclude<ClaimReply, { status: 'BUSY' }>, key: string, stats: Stats, hooks: Hooks): Exclude<ClaimStep, { next: 'claim' | 'busy' }> {
  switch (reply.status) {
    case 'NEW':
    case 'SEEN':
    case 'RETRY':
      return { next: 'run', job: new Job(key, reply.attempt, reply.status, reply.token) };
    case 'DONE':
      // Counted by countReplay once the caller knows it is one (under
      // durable, a replay not acknowledged is NotDurable instead).
      return { next: 'replay', attempt: reply.attempt, result: reply.result };
    case 'MISMATCH':
      stats.mismatches++;
      return { next: 'throw', error: new MismatchError(key, reply.attempt) };
    case 'EXHAUSTED':
      stats.exhausted++;
      return { next: 'throw', error: new ExhaustedError(key, reply.attempt) };
  }
}

/** A granted claim counted once it may run (with `durable`, once WAIT acknowledged it). */
export function countRun(job: Job, stats: Stats): void {
  if (job.status === 'NEW') stats.firstRuns++;
  else stats.retries++;
}

/** The Busy error a call ends with, carrying the holder's owner as IDEM.GET read it. */
export const busyError = (key: string, attempt: number, leaseLeft: number, record: RecordInfo | null | undefined): BusyError =>
  new BusyError(key, attempt, leaseLeft, record?.owner ?? null);

// ---- durable: what WAIT / WAITAOF's answer means ----

/** The WAIT that follows a command with `durable`. */
export const waitArgs = (d: DurableSettings): (string | number)[] =>
  d.fsync ? ['WAITAOF', 1, d.replicas, d.timeout] : ['WAIT', d.replicas, d.timeout];

/** Acknowledgements in WAIT's (or WAITAOF's) reply: enough, and how many; a refused WAITAOF is never enough. */
export function acknowledged(d: DurableSettings, reply: unknown): { durable: boolean; count: number } {
  if (reply instanceof Error || reply === undefined) return { durable: false, count: -1 };
  if (d.fsync) {
    const pair = Array.isArray(reply) ? reply.map(Number) : [];
    const count = pair[1] ?? -1;
    return { durable: pair[0]! >= 1 && count >= d.replicas, count };
  }
  const count = Number(reply);
  return { durable: count >= d.replicas, count };
}

/**
 * With `durable`, the error (counted) when `ack`, the WAIT after a claim,
 * fell short of a claim it matters to, in process(), processMany() and
 * claimMany() alike: a granted claim (stage 'claim': the caller gives it
 * back) or a replay (stage 'done', carrying `result`: the completion read
 * may not have reached the replicas yet, a primary that has just lost its
 * role keeps answering). BUSY and refused claims wrote and read nothing to
 * keep. `ack` undefined: durable not asked.
 */
export function claimNotDurable(reply: ClaimReply, key: string, ack: { durable: boolean; count: number } | undefined, stats: Stats, result?: unknown): NotDurableError | undefined {
  if (ack === undefined || ack.durable) return undefined;
  let error: NotDurableError;
  if (reply.status === 'DONE') error = new NotDurableError(key, 'done', ack.count, result);
  else if (reply.status === 'NEW' || reply.status === 'SEEN' || reply.status === 'RETRY') error = new NotDurableError(key, 'claim', ack.count);
  else return undefined;
  stats.notDurable++;
  return error;
}

// ---- completing ----

/** The work's value encoded for RESULT, or why it is not stored. */
export function encodeResult(codec: Codec, value: unknown, maxResult: number): { result?: Bytes; dropped?: DropReason; cause?: unknown } {
  let result: Bytes;
  try {
    result = codec.encode(value);
    if (typeof result !== 'string' && !Buffer.isBuffer(result)) throw new TypeError('the codec did not return a string or a Buffer');
  } catch (cause) {
    return { dropped: 'unserializable', cause };
  }
  // A string's UTF-8 size is at most 3 bytes per UTF-16 unit: count only where it may matter.
  const size = typeof result === 'string' && result.length * 3 <= maxResult ? 0 : Buffer.byteLength(result);
  if (size > maxResult) return { dropped: 'oversize', cause: new ResultTooLargeError(`the result is ${size} bytes, over idem.max-result (${maxResult})`) };
  return { result };
}

/**
 * What one DONE's answer (or failure) means: completed; check (0: done
 * already, look with IDEM.GET); lost (STALE); too-large (complete without
 * the result); retry (the reply was lost: send DONE again); fail (any other
 * error: the record was not completed).
 */
export type DoneVerdict = 'completed' | 'check' | 'lost' | 'too-large' | 'retry' | 'fail';

export function judgeDone(reply: DoneReply | undefined, error: unknown): DoneVerdict {
  if (error !== undefined) {
    if (error instanceof StaleError) return 'lost';
    if (error instanceof ResultTooLargeError) return 'too-large';
    return isReplyError(error) ? 'fail' : 'retry';
  }
  // 0: done already. It is this job's own completion when the record shows
  // its attempt (a DONE resent after a lost reply): nobody else can have
  // claimed in between.
  return reply!.alreadyDone ? 'check' : 'completed';
}

/** `IDEM.GET` after a DONE answered 0: this job's own completion? */
export const ownCompletion = (record: RecordInfo | null, attempt: number): boolean => record?.state === 'done' && record.attempt === attempt;

/** The pause before DONE's `n`th resend (from 0): 50 ms doubling. */
export const doneBackoff = (n: number): number => 50 * 2 ** n;

/** A DONE or RELEASE that got no reply within its deadline (its reply counts as lost). */
export const timedOut = (err: unknown): boolean => err instanceof DeadlineError;

/**
 * A completed job reported: counted, `onResultDropped` and `onDone` called,
 * and the error the caller gets, if any (ResultNotStored for a result the
 * codec refused or, with `oversize: 'error'`, one too large; Hook when
 * `onDone` throws).
 */
export async function completed(
  job: Job,
  value: unknown,
  dropped: DropReason | undefined,
  cause: unknown,
  s: { stats: Stats; hooks: Hooks; oversize: 'complete' | 'error' },
): Promise<{ resultStored: boolean; error?: Error }> {
  s.stats.completed++;
  if (dropped) {
    s.stats.resultsDropped++;
    notify(s.hooks, 'onResultDropped', job, dropped);
  }
  const resultStored = dropped === undefined;
  if (s.hooks.onDone !== undefined) {
    try {
      await s.hooks.onDone(job, resultStored);
    } catch (err) {
      return { resultStored, error: new HookError('onDone', err, value) };
    }
  }
  if (dropped === 'unserializable' || (dropped === 'oversize' && s.oversize === 'error')) {
    return { resultStored, error: new ResultNotStoredError(job.key, value, cause) };
  }
  return { resultStored };
}

// ---- batches ----

/** The most keys one batch call takes (the module's limit). */
export const MAX_BATCH_KEYS = 10000;

/** Indices of `keys` grouped by slot (one group in all outside a cluster), in first-seen order. */
export function groupBySlot(keys: readonly string[], cluster: boolean): number[][] {
  if (!cluster) return [keys.map((_, i) => i)];
  const bySlot = new Map<number, number[]>();
  keys.forEach((key, i) => {
    const slot = calculateSlot(key);
    let group = bySlot.get(slot);
    if (!group) bySlot.set(slot, (group = []));
    group.push(i);
  });
  return [...bySlot.values()];
}

/** A group's indices cut into calls of at most MAX_BATCH_KEYS. */
export function chunk(group: number[]): number[][] {
  if (group.length <= MAX_BATCH_KEYS) return [group];
  const calls: number[][] = [];
  for (let i = 0; i < group.length; i += MAX_BATCH_KEYS) calls.push(group.slice(i, i + MAX_BATCH_KEYS));
  return calls;
}

/** Indices of `keys` grouped into batch calls: one per slot in a cluster, at most MAX_BATCH_KEYS each. */
export const planBatch = (keys: readonly string[], cluster: boolean): number[][] => groupBySlot(keys, cluster).flatMap(chunk);
