// process(key, work): claim, run with a heartbeat, complete or give back,
// replay. Every decision is core.ts's; this file sends what it decides.
import type { Connection } from './connection.js';
import {
  type ClaimStep,
  ClaimLoop,
  type DoneVerdict,
  type DropReason,
  type Hooks,
  type IdemOptions,
  type Job,
  MAX_WAIT_PIECE,
  type ProcessOptions,
  type Settings,
  type Stats,
  completed,
  doneBackoff,
  encodeResult,
  judgeDone,
  leaseLost,
  notify,
  ownCompletion,
  settings,
} from './core.js';
import { DoneUnconfirmedError, HookError, LeaseLostError, isReplyError } from './errors.js';
import { Heartbeat } from './heartbeat.js';
import type { DoneReply, GrantedStatus } from './types.js';

/** What the loop works with: the Idem instance's parts. */
export interface Runtime {
  conn: Connection;
  prefix: string;
  options: IdemOptions;
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

export async function process<T>(rt: Runtime, key: string, work: Work<T>, options: ProcessOptions<T> = {}): Promise<Outcome<T>> {
  const s = settings(rt.options, options);
  const stored = rt.prefix + key;
  const bloom = s.bloom === undefined ? undefined : rt.prefix + s.bloom;
  const loop = new ClaimLoop(await rt.conn.edition(), s.wait, rt.stats, rt.hooks, rt.conn.transport.maxBlock ?? MAX_WAIT_PIECE);
  let step: ClaimStep = { next: 'claim', pause: 0 };
  while (step.next === 'claim') {
    if (step.pause) await sleep(step.pause);
    try {
      step = loop.onReply(await rt.conn.claim(stored, s.lease, { payload: options.payload, maxTries: s.maxTries, bloom, wait: loop.wait() }), key);
    } catch (err) {
      step = loop.onError(err);
    }
  }
  if (step.next === 'throw') throw step.error;
  if (step.next === 'replay') {
    const value = step.result === null ? undefined : (s.codec.decode(step.result) as T);
    return { value, replayed: true, attempt: step.attempt, status: 'DONE', resultStored: step.result !== null, waited: loop.waited };
  }
  const job = step.job;
  try {
    await rt.hooks.onRun?.(job);
  } catch (err) {
    await giveBack(rt, job, stored, err);
    throw new HookError('onRun', err);
  }
  const heartbeat = new Heartbeat(rt.conn, s.lease, s.heartbeat, rt.stats, rt.hooks);
  heartbeat.add(job, stored);
  let value: T;
  try {
    value = await work(job);
  } catch (err) {
    await heartbeat.stop(); // before RELEASE: an EXTEND after it would take the key for lost
    if (job.lost) throw new LeaseLostError(key, job.attempt, { cause: err }); // the claim is another worker's now
    await giveBack(rt, job, stored, err);
    throw err;
  }
  await heartbeat.stop();
  // The heartbeat saw the key claimed by another worker: its DONE would be refused.
  if (job.lost) throw job.signal.reason as Error;
  const { resultStored, error } = await complete(rt, s, job, stored, bloom, value);
  if (error) throw error;
  return { value, replayed: false, attempt: job.attempt, status: job.status, resultStored, waited: loop.waited };
}

/** RELEASE after a failed work or hook (a waiting duplicate takes over at once); counted and told. */
export async function giveBack(rt: Runtime, job: Job, stored: string, error: unknown): Promise<void> {
  try {
    await rt.conn.release(stored, job.token);
  } catch {
    // the lease lapses by itself: the next claim answers RETRY all the same
  }
  rt.stats.released++;
  notify(rt.hooks, 'onRelease', job, error);
}

/**
 * What a DONE's answer means; a 0 is looked up with IDEM.GET (this job's own
 * completion, or another's). `resultDropped`: the record kept no result
 * (DONE's 3 or 7, or the record seen without one).
 */
export async function doneVerdict(
  rt: Runtime,
  stored: string,
  job: Job,
  reply: DoneReply | undefined,
  failure: unknown,
): Promise<{ verdict: DoneVerdict; resultDropped: boolean }> {
  const verdict = judgeDone(reply, failure);
  if (verdict !== 'check') return { verdict, resultDropped: !!reply?.resultDropped };
  try {
    const record = await rt.conn.get(stored);
    return { verdict: ownCompletion(record, job.attempt) ? 'completed' : 'lost', resultDropped: record?.result === null };
  } catch (err) {
    return { verdict: isReplyError(err) ? 'fail' : 'retry', resultDropped: false };
  }
}

/** The work returned: from here on the record is completed, whatever fails. */
async function complete(
  rt: Runtime,
  s: Settings,
  job: Job,
  stored: string,
  bloom: string | undefined,
  value: unknown,
): Promise<{ resultStored: boolean; error?: Error }> {
  let { result, dropped, cause } = encodeResult(s.codec, value, await rt.conn.maxResult());
  let resends = 0;
  for (;;) {
    let reply: DoneReply | undefined;
    let failure: unknown;
    try {
      reply = await rt.conn.done(stored, job.token, { result, retain: s.retain, bloom });
    } catch (err) {
      failure = err;
    }
    const { verdict, resultDropped } = await doneVerdict(rt, stored, job, reply, failure);
    switch (verdict) {
      case 'completed':
        if (resultDropped && !dropped) dropped = 'memory' satisfies DropReason;
        return completed(job, value, dropped, cause, { stats: rt.stats, hooks: rt.hooks, oversize: s.oversize });
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
      case 'fail':
        return { resultStored: false, error: new DoneUnconfirmedError(job.key, value, failure) };
    }
  }
}
