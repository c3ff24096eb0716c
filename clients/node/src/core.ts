// The consumer loop's decisions, without I/O (docs/clients.md, "What
// process(key, work) does"): the settings and their defaults, the counters,
// the job, what each claim answer means, how a result is encoded, what a
// DONE answer means, how a completion is reported, and how a batch is cut
// into calls. loop.ts and many.ts only send what this decides.
import calculateSlot from 'cluster-key-slot';
import { type Codec, json } from './codec.js';
import { seconds } from './commands.js';
import {
  BusyError,
  ExhaustedError,
  HookError,
  IdemReplyError,
  LeaseLostError,
  MismatchError,
  ResultNotStoredError,
  ResultTooLargeError,
  StaleError,
  isReplyError,
} from './errors.js';
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
  /** claims given back after a failed work or hook */
  released: number;
  /** leases found lost (by a heartbeat or by DONE), once per job */
  leasesLost: number;
  /** completions recorded without their result */
  resultsDropped: number;
  mismatches: number;
  exhausted: number;
  /** heartbeat extensions that succeeded */
  extends: number;
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
  try {
    (hooks[name] as ((...a: unknown[]) => void) | undefined)?.(...args);
  } catch {
    // ignored: the outcome is settled already
  }
}

const controllers = new WeakMap<Job, AbortController>();

/** One claimed key, given to the work. */
export class Job {
  constructor(
    /** the key as given (without the instance's prefix) */
    readonly key: string,
    /** the fencing number: pass it to your writes downstream */
    readonly attempt: number,
    /** how the claim was granted: NEW, RETRY (an earlier try may have partly run) or SEEN (the BLOOM filter may have seen it complete) */
    readonly status: GrantedStatus,
    /** the claim's token (for the typed commands) */
    readonly token: string,
  ) {
    controllers.set(this, new AbortController());
  }

  /** true once the lease is known lost (another worker claimed the key) */
  get lost(): boolean {
    return this.signal.aborted;
  }

  /** aborted when the lease is lost */
  get signal(): AbortSignal {
    return controllers.get(this)!.signal;
  }
}

/** Marks the job's lease lost; true the first time (count it then). */
export function loseLease(job: Job, reason: Error): boolean {
  const controller = controllers.get(job)!;
  if (controller.signal.aborted) return false;
  controller.abort(reason);
  return true;
}

/** The job's lease found lost (by a heartbeat or by DONE): marked, counted and told once; the error for the caller. */
export function leaseLost(job: Job, cause: unknown, stats: Stats, hooks: Hooks): LeaseLostError {
  const error = new LeaseLostError(job.key, job.attempt, { cause });
  if (loseLease(job, error)) {
    stats.leasesLost++;
    notify(hooks, 'onLeaseLost', job);
  }
  return error;
}

/** The instance's settings (docs/clients.md's defaults); every duration in ms. */
export interface IdemOptions {
  /** prefixed to every key this instance names (records and filters) */
  prefix?: string;
  /** skip asking the server which edition it runs */
  edition?: Edition;
  /** result codec (json) */
  codec?: Codec;
  /** ms, whole seconds (30000) */
  lease?: number;
  /** ms a duplicate waits for the copy in flight (10000; 0: do not wait) */
  wait?: number;
  /** ms between EXTENDs while the work runs (lease / 3; 0: none) */
  heartbeat?: number;
  /** MAXTRIES: Exhausted after that many tries (none) */
  maxTries?: number;
  /** ms a done record is kept, whole seconds (the server's idem.retain) */
  retain?: number;
  /** DONE sent again after a connection error (5) */
  doneRetries?: number;
  /** a result over idem.max-result: 'complete' returns it unstored, 'error' throws ResultNotStoredError ('complete') */
  oversize?: 'complete' | 'error';
  /** idem.max-result in bytes (read from the server where not given) */
  maxResult?: number;
  hooks?: Hooks;
}

/** Per call: the instance's settings overridden, and the message's payload. */
export interface ProcessOptions<T = unknown> {
  /** PAYLOAD: a key reused with another payload is Mismatch */
  payload?: Bytes;
  lease?: number;
  wait?: number;
  heartbeat?: number;
  maxTries?: number;
  retain?: number;
  /** BLOOM filter key (module only), prefixed like the record's */
  bloom?: string;
  codec?: Codec<T>;
}

export interface Settings {
  lease: number;
  wait: number;
  heartbeat: number;
  maxTries?: number;
  retain?: number;
  bloom?: string;
  codec: Codec;
  oversize: 'complete' | 'error';
  doneRetries: number;
}

function nonNegative(ms: number, what: string): number {
  if (typeof ms !== 'number' || !(ms >= 0) || !Number.isFinite(ms)) throw new RangeError(`${what} is in ms and must be >= 0 (got ${ms})`);
  return ms;
}

/** The settings of one call, checked before anything is sent. */
export function settings(instance: IdemOptions, call: ProcessOptions = {}): Settings {
  const lease = call.lease ?? instance.lease ?? 30000;
  seconds(lease, 'lease');
  const retain = call.retain ?? instance.retain;
  if (retain !== undefined) seconds(retain, 'retain');
  const oversize = instance.oversize ?? 'complete';
  if (oversize !== 'complete' && oversize !== 'error') throw new RangeError(`oversize is 'complete' or 'error' (got ${String(oversize)})`);
  const doneRetries = instance.doneRetries ?? 5;
  if (!Number.isInteger(doneRetries) || doneRetries < 0) throw new RangeError(`doneRetries must be a whole number >= 0 (got ${doneRetries})`);
  return {
    lease,
    wait: Math.ceil(nonNegative(call.wait ?? instance.wait ?? 10000, 'wait')),
    heartbeat: nonNegative(call.heartbeat ?? instance.heartbeat ?? lease / 3, 'heartbeat'),
    maxTries: call.maxTries ?? instance.maxTries,
    retain,
    bloom: call.bloom,
    codec: (call.codec ?? instance.codec ?? json) as Codec,
    oversize,
    doneRetries,
  };
}

/** The server's WAIT takes at most an hour: a longer wait goes in pieces. */
export const MAX_WAIT_PIECE = 3600000;

/** What the loop does next, after a claim's answer. */
export type ClaimStep =
  | { next: 'claim'; pause: number }
  | { next: 'run'; job: Job }
  | { next: 'replay'; attempt: number; result: Buffer | null }
  | { next: 'throw'; error: Error };

/**
 * One call's claims: the first without WAIT (so that a busy key is seen and
 * counted once), then WAIT for the time left on the module (in pieces of at
 * most `piece` ms), polling on the Functions edition (10 ms doubling to
 * 1 s, jittered, never past the holder's lease end nor the deadline).
 * TRYAGAIN and UNBLOCKED wrote nothing: the claim is sent again.
 */
export class ClaimLoop {
  readonly #deadline: number;
  #waited = false;
  #busySeen = false;
  #backoff = 10;
  #resent = 0;

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
    const retryable = err instanceof IdemReplyError && /^(TRYAGAIN|UNBLOCKED)\b/.test(err.message);
    // Past the deadline the next claim has no WAIT and answers at once; a
    // few such resends bound a server that keeps answering TRYAGAIN.
    if (retryable && (this.#left() > 0 || this.#resent++ < 3)) return { next: 'claim', pause: 10 };
    return { next: 'throw', error: err instanceof Error ? err : new Error(String(err)) };
  }

  onReply(reply: ClaimReply, keyAsGiven: string): ClaimStep {
    switch (reply.status) {
      case 'BUSY': {
        if (!this.#busySeen) {
          this.#busySeen = true;
          notify(this.hooks, 'onBusy', keyAsGiven, reply.leaseLeft);
        }
        const left = this.#left();
        if (left <= 0) {
          this.stats.busy++;
          return { next: 'throw', error: new BusyError(keyAsGiven, reply.attempt, reply.leaseLeft) };
        }
        if (!this.#waited) {
          this.#waited = true;
          this.stats.waits++;
        }
        if (this.edition === 'module') return { next: 'claim', pause: 0 }; // with WAIT, see wait()
        const jittered = this.#backoff * (0.75 + Math.random() / 2);
        this.#backoff = Math.min(this.#backoff * 2, 1000);
        return { next: 'claim', pause: Math.max(1, Math.min(jittered, left, reply.leaseLeft)) };
      }
      default:
        return claimed(reply, keyAsGiven, this.stats, this.hooks);
    }
  }
}

/** A claim's answer other than BUSY, counted (process() and processMany() alike). */
export function claimed(reply: Exclude<ClaimReply, { status: 'BUSY' }>, key: string, stats: Stats, hooks: Hooks): Exclude<ClaimStep, { next: 'claim' }> {
  switch (reply.status) {
    case 'NEW':
    case 'SEEN':
    case 'RETRY':
      if (reply.status === 'NEW') stats.firstRuns++;
      else stats.retries++;
      return { next: 'run', job: new Job(key, reply.attempt, reply.status, reply.token) };
    case 'DONE':
      stats.replays++;
      notify(hooks, 'onReplay', key, reply.attempt);
      return { next: 'replay', attempt: reply.attempt, result: reply.result };
    case 'MISMATCH':
      stats.mismatches++;
      return { next: 'throw', error: new MismatchError(key, reply.attempt) };
    case 'EXHAUSTED':
      stats.exhausted++;
      return { next: 'throw', error: new ExhaustedError(key, reply.attempt) };
  }
}

/** The work's value encoded for RESULT, or why it is not stored. */
export function encodeResult(codec: Codec, value: unknown, maxResult: number): { result?: Bytes; dropped?: DropReason; cause?: unknown } {
  let result: Bytes;
  try {
    result = codec.encode(value);
    if (typeof result !== 'string' && !Buffer.isBuffer(result)) throw new TypeError('the codec did not return a string or a Buffer');
  } catch (cause) {
    return { dropped: 'unserializable', cause };
  }
  const size = Buffer.byteLength(result);
  if (size > maxResult) return { dropped: 'oversize', cause: new ResultTooLargeError(`the result is ${size} bytes, over idem.max-result (${maxResult})`) };
  return { result };
}

/** What one DONE's answer (or failure) means. */
export type DoneVerdict = 'completed' | 'check' | 'lost' | 'too-large' | 'retry' | 'fail';

export function judgeDone(reply: DoneReply | undefined, error: unknown): DoneVerdict {
  if (error !== undefined) {
    if (error instanceof StaleError) return 'lost';
    if (error instanceof ResultTooLargeError) return 'too-large';
    return isReplyError(error) ? 'fail' : 'retry';
  }
  // 0: done already. It is this job's own completion when the record shows
  // its attempt (a DONE resent, by us or by the client, after a lost reply):
  // nobody else can have claimed in between.
  return reply!.alreadyDone ? 'check' : 'completed';
}

/** `IDEM.GET` after a DONE answered 0: this job's own completion? */
export const ownCompletion = (record: RecordInfo | null, attempt: number): boolean => record?.state === 'done' && record.attempt === attempt;

/** The pause before DONE's `n`th resend (from 0): 50 ms doubling. */
export const doneBackoff = (n: number): number => 50 * 2 ** n;

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
  try {
    await s.hooks.onDone?.(job, resultStored);
  } catch (err) {
    return { resultStored, error: new HookError('onDone', err, value) };
  }
  if (dropped === 'unserializable' || (dropped === 'oversize' && s.oversize === 'error')) {
    return { resultStored, error: new ResultNotStoredError(job.key, value, cause) };
  }
  return { resultStored };
}

/** The most keys one batch call takes (the module's limit). */
export const MAX_BATCH_KEYS = 10000;

/** Indices of `keys` grouped into batch calls: one per slot in a cluster, at most MAX_BATCH_KEYS each. */
export function planBatch(keys: string[], cluster: boolean): number[][] {
  const bySlot = new Map<number, number[]>();
  keys.forEach((key, i) => {
    const slot = cluster ? calculateSlot(key) : 0;
    let group = bySlot.get(slot);
    if (!group) bySlot.set(slot, (group = []));
    group.push(i);
  });
  const calls: number[][] = [];
  for (const group of bySlot.values()) {
    for (let i = 0; i < group.length; i += MAX_BATCH_KEYS) calls.push(group.slice(i, i + MAX_BATCH_KEYS));
  }
  return calls;
}
