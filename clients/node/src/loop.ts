// process(key, work): claim, run with a heartbeat, complete or give back,
// replay. Every decision is core.ts's; this file sends what it decides.
import type { Ack, Connection, Done, Ride } from './connection.js';
import {
  claimNotDurable,
  type ClaimStep,
  ClaimLoop,
  type DoneVerdict,
  type DropReason,
  type Hooks,
  type Job,
  lostReason,
  MAX_WAIT_PIECE,
  type Stats,
  busyError,
  claimed,
  countReplay,
  completed,
  countRun,
  doneBackoff,
  encodeResult,
  holdLease,
  judgeDone,
  leaseLost,
  notify,
  ownCompletion,
} from './core.js';
import { DoneUnconfirmedError, HookError, LeaseLostError, NotDurableError, isReplyError } from './errors.js';
import type { Heartbeat } from './heartbeat.js';
import { type ProcessOptions, type Settings, callSettings } from './settings.js';
import type { Coalescer } from './tick.js';
import type { DoneOptions, DoneReply, GrantedStatus, RecordInfo } from './types.js';

/** What the loop works with: the Idem instance's parts. */
export interface Runtime {
  conn: Connection;
  coalescer: Coalescer;
  heartbeat: Heartbeat;
  prefix: string;
  settings: Settings;
  stats: Stats;
  hooks: Hooks;
}

/** What process() resolves with. */
export interface Outcome<T> {
  /** the work's own value on a first run; on a replay the codec's decoding of the stored result (undefined: none stored) */
  value: T | undefined;
  /** true: the record was done already and its result replayed; the work did not run */
  replayed: boolean;
  attempt: number;
  /** how the claim was granted, or DONE for a replay */
  status: GrantedStatus | 'DONE';
  /** the record keeps this result (a replay gets it) */
  resultStored: boolean;
  /** the call met a busy key and waited */
  waited: boolean;
}

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export type Work<T> = (job: Job) => T | Promise<T>;

/** The claims of a call after its first met a busy key or failed. */
const claimLoop = (rt: Runtime, s: Settings) =>
  new ClaimLoop(rt.conn.known ?? 'functions', s.wait, rt.stats, rt.hooks, rt.conn.transport.maxBlock ?? MAX_WAIT_PIECE);

/** The holder's record, read once for the Busy error (null when the read fails). */
async function holder(rt: Runtime, stored: string): Promise<RecordInfo | null> {
  try {
    return await rt.conn.get(stored);
  } catch {
    return null;
  }
}

/**
 * `ride` (the broker adapters'): commands written after each DONE on its
 * connection (connection.ts's Ride); such a DONE goes alone, never in a
 * shared IDEM.MDONE.
 */
export async function process<T>(rt: Runtime, key: string, work: Work<T>, options?: ProcessOptions<T>, ride?: Ride): Promise<Outcome<T>> {
  const s = callSettings(rt.settings, options, rt.prefix);
  const stored = rt.prefix + key;
  const payload = options?.payload;
  let step: ClaimStep;
  let loop: ClaimLoop | undefined;
  let ack: Ack | undefined;
  // When the granting claim was sent (a lease starts no earlier on the server);
  // a claim that waited (WAIT) was granted when its reply came.
  let sent = performance.now();
  try {
    const first = await rt.coalescer.claim(stored, s, payload);
    ack = first.ack;
    step = first.reply.status === 'BUSY' ? (loop = claimLoop(rt, s)).onReply(first.reply, key) : claimed(first.reply, key, rt.stats, rt.hooks);
  } catch (err) {
    step = (loop = claimLoop(rt, s)).onError(err);
  }
  while (step.next === 'claim') {
    if (step.pause) await sleep(step.pause);
    try {
      const wait = loop!.wait();
      sent = performance.now();
      const again = await rt.conn.claimFor(stored, s, payload, wait);
      if (wait) sent = performance.now();
      ack = again.ack;
      step = loop!.onReply(again.reply, key);
    } catch (err) {
      step = loop!.onError(err);
    }
  }
  const waited = loop?.waited ?? false;
  switch (step.next) {
    case 'throw':
      throw step.error;
    case 'busy':
      throw busyError(key, step.attempt, step.leaseLeft, await holder(rt, stored));
    case 'replay': {
      const value = step.result === null ? undefined : (s.codec.decode(step.result) as T);
      // The completion it replays may live on this primary alone (a DONE not yet
      // replicated, a primary cut off from its replicas): not to be acknowledged yet.
      const undurable = claimNotDurable({ status: 'DONE', result: step.result, attempt: step.attempt }, key, s.durable === undefined ? undefined : (ack ?? { durable: false, count: -1 }), rt.stats, value);
      if (undurable) throw undurable;
      countReplay(key, step.attempt, rt.stats, rt.hooks);
      return { value, replayed: true, attempt: step.attempt, status: 'DONE', resultStored: step.result !== null, waited };
    }
  }
  const job = step.job;
  holdLease(job, sent + s.lease);
  if (s.durable !== undefined && !ack?.durable) {
    // Not acknowledged: given back before any work ran; the redelivery retries.
    await rt.conn.releaseFor(stored, job.token, s).catch(() => false);
    rt.stats.notDurable++;
    throw new NotDurableError(key, 'claim', ack?.count ?? -1);
  }
  countRun(job, rt.stats);
  if (rt.hooks.onRun !== undefined) {
    try {
      await rt.hooks.onRun(job);
    } catch (err) {
      await giveBack(rt, s, job, stored, err);
      throw new HookError('onRun', err);
    }
  }
  const beat = rt.heartbeat.start(job, stored, s.lease, s.heartbeat);
  let value: T;
  try {
    value = await work(job);
  } catch (err) {
    const extending = rt.heartbeat.stop(beat); // before RELEASE: an EXTEND after it would take the key for lost
    if (extending) await extending;
    if (job.lost) throw new LeaseLostError(key, job.attempt, { cause: err }); // the claim is another worker's now
    await giveBack(rt, s, job, stored, err);
    throw err;
  }
  const extending = rt.heartbeat.stop(beat);
  if (extending) await extending;
  // The heartbeat saw the key claimed by another worker: its DONE would be refused.
  if (job.lost) throw lostReason(job)!;
  const encoded = encodeResult(s.codec, value, rt.conn.knownMaxResult ?? (await rt.conn.maxResult()));
  let first: Done | undefined;
  let failure: unknown;
  try {
    first = await sendDone(rt, s, stored, job, { result: encoded.result, retain: s.retain, bloom: s.bloom }, ride);
  } catch (err) {
    failure = err;
  }
  // The common answer: completed with its result, and nothing more to tell or wait for.
  if (first?.reply.completed && !first.reply.resultDropped && encoded.dropped === undefined && s.durable === undefined && rt.hooks.onDone === undefined) {
    rt.stats.completed++;
    return { value, replayed: false, attempt: job.attempt, status: job.status, resultStored: true, waited };
  }
  const { resultStored, error } = await complete(rt, s, job, stored, value, encoded, first, failure, ride);
  if (error) throw error;
  return { value, replayed: false, attempt: job.attempt, status: job.status, resultStored, waited };
}

/** The loop's DONE: shared with concurrent calls (batch), or alone with `ride`'s commands after it. */
const sendDone = (rt: Runtime, s: Settings, stored: string, job: Job, o: DoneOptions, ride: Ride | undefined): Promise<Done> =>
  ride ? rt.conn.doneFor(stored, job.token, o, s, ride) : rt.coalescer.done(stored, job.token, o, s);

/**
 * RELEASE after a failed work or hook (a waiting duplicate takes over at
 * once): sent once, within doneTimeout; counted only when it answered 1;
 * `onRelease` told either way. A RELEASE that fails leaves the claim to lapse.
 */
export async function giveBack(rt: Runtime, s: Settings, job: Job, stored: string, error: unknown): Promise<void> {
  let released = false;
  try {
    released = await rt.conn.releaseFor(stored, job.token, s);
  } catch {
    // the lease lapses by itself: the next claim answers RETRY all the same
  }
  if (released) rt.stats.released++;
  notify(rt.hooks, 'onRelease', job, error);
}

/**
 * What a DONE's answer means; a 0 is looked up with IDEM.GET (this job's own
 * completion, or another's). `resultDropped`: the record kept no result
 * (DONE's 3 or 7, or the record seen without one); `failure`: the error
 * behind a 'fail' or 'retry' (DONE's, or the look-up's).
 */
export async function doneVerdict(
  rt: Runtime,
  stored: string,
  job: Job,
  reply: DoneReply | undefined,
  failure: unknown,
): Promise<{ verdict: DoneVerdict; resultDropped: boolean; failure: unknown }> {
  const verdict = judgeDone(reply, failure);
  if (verdict !== 'check') return { verdict, resultDropped: !!reply?.resultDropped, failure };
  try {
    const record = await rt.conn.get(stored);
    return { verdict: ownCompletion(record, job.attempt) ? 'completed' : 'lost', resultDropped: record?.result === null, failure };
  } catch (err) {
    return { verdict: isReplyError(err) ? 'fail' : 'retry', resultDropped: false, failure: err };
  }
}

/**
 * The work returned and its first DONE was answered (or failed): from here
 * on the record is completed, whatever fails; DONE is sent again after a
 * lost reply, at most doneRetries times.
 */
async function complete(
  rt: Runtime,
  s: Settings,
  job: Job,
  stored: string,
  value: unknown,
  encoded: ReturnType<typeof encodeResult>,
  first: Done | undefined,
  firstFailure: unknown,
  ride: Ride | undefined,
): Promise<{ resultStored: boolean; error?: Error }> {
  let { result, dropped, cause } = encoded;
  let resends = 0;
  for (let attempt = 0; ; attempt++) {
    let reply: DoneReply | undefined;
    let ack: Ack | undefined;
    let sent: unknown;
    if (attempt === 0) {
      ({ reply, ack } = first ?? {});
      sent = firstFailure;
    } else {
      try {
        ({ reply, ack } = await sendDone(rt, s, stored, job, { result, retain: s.retain, bloom: s.bloom }, ride));
      } catch (err) {
        sent = err;
      }
    }
    const { verdict, resultDropped, failure } = await doneVerdict(rt, stored, job, reply, sent);
    switch (verdict) {
      case 'completed': {
        if (resultDropped && !dropped) dropped = 'memory' satisfies DropReason;
        const outcome = await completed(job, value, dropped, cause, { stats: rt.stats, hooks: rt.hooks, oversize: s.oversize });
        if (s.durable !== undefined && !ack?.durable) {
          rt.stats.notDurable++;
          return { resultStored: outcome.resultStored, error: new NotDurableError(job.key, 'done', ack?.count ?? -1, value) };
        }
        return outcome;
      }
      case 'too-large': // the server's limit is lower than we knew: complete without the result
        result = undefined;
        dropped = 'oversize';
        cause = failure;
        continue;
      case 'retry':
        if (resends >= s.doneRetries) return { resultStored: false, error: new DoneUnconfirmedError(job.key, value, failure) };
        await sleep(doneBackoff(resends++));
        continue;
      case 'lost':
        return { resultStored: false, error: leaseLost(job, failure, rt.stats, rt.hooks) };
      case 'fail': // any other error (WRONGTYPE: the key was overwritten): the record was not completed
        return { resultStored: false, error: failure instanceof Error ? failure : new Error(String(failure)) };
    }
  }
}
