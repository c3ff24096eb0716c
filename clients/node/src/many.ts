// processMany(keys, work): one claimMany, the work for every granted key (at
// most `concurrency` at once, each kept alive by the instance's heartbeat),
// then one doneMany for the successes and one releaseMany for the failures.
// The decisions are core.ts's, the same as process()'s (a DONE batch whose
// reply is lost is sent again and each 0 confirmed with IDEM.GET; a key
// still unconfirmed is DoneUnconfirmed in its item); a busy key is not
// waited for.
import { claimMany, doneMany, releaseMany } from './batch.js';
import type { Ack } from './connection.js';
import {
  claimNotDurable,
  type DropReason,
  type Job,
  lostReason,
  busyError,
  claimed,
  countReplay,
  completed,
  countRun,
  doneBackoff,
  encodeResult,
  holdLease,
  leaseLost,
  notify,
} from './core.js';
import { DoneUnconfirmedError, HookError, LeaseLostError, NotDurableError } from './errors.js';
import { type Runtime, type Work, doneVerdict, sleep } from './loop.js';
import { type ProcessOptions, type Settings, callSettings } from './settings.js';
import type { Bytes, DoneReply } from './types.js';

/** How one key of processMany() ended. */
export type BatchStatus = 'processed' | 'replayed' | 'busy' | 'failed' | 'lost' | 'mismatch' | 'exhausted' | 'not_durable' | 'error';

/** One key's outcome in processMany(), in the keys' order. */
export interface BatchItem<T> {
  key: string;
  status: BatchStatus;
  /** processed: the work's value; replayed: the stored result decoded; not_durable at 'done' and error with DoneUnconfirmedError: the work's value */
  value?: T;
  /**
   * failed: the work's error (or a HookError); lost: LeaseLostError; busy,
   * mismatch, exhausted, not_durable: their error; error: the key's error
   * reply, or DoneUnconfirmedError; processed: ResultNotStoredError or
   * HookError where process() would throw it
   */
  error?: unknown;
  attempt?: number;
  resultStored?: boolean;
}

export interface ProcessManyOptions<T> extends Omit<ProcessOptions<T>, 'payload' | 'wait'> {
  /** one per key, or none */
  payloads?: Bytes[];
  /** how many works run at once (16) */
  concurrency?: number;
}

interface Ran<T> {
  i: number;
  job: Job;
  value: T;
  result?: Bytes;
  dropped?: DropReason;
  cause?: unknown;
}

interface Granted {
  i: number;
  job: Job;
}

export async function processMany<T>(rt: Runtime, keys: string[], work: Work<T>, o: ProcessManyOptions<T> = {}): Promise<BatchItem<T>[]> {
  const s = callSettings(rt.settings, o, rt.prefix);
  const stored = keys.map((key) => rt.prefix + key);
  const sent = performance.now();
  const { replies, acks } = await claimMany(rt.conn, stored, s.lease, { payloads: o.payloads, maxTries: s.maxTries, bloom: s.bloom, owner: s.owner }, undefined, {
    durable: s.durable,
  });
  const out: BatchItem<T>[] = new Array(keys.length);
  const granted: Granted[] = [];
  const unacked: Granted[] = [];
  const busy: Promise<void>[] = [];
  replies.forEach((reply, i) => {
    const key = keys[i]!;
    if (reply instanceof Error) out[i] = { key, status: 'error', error: reply };
    else if (reply.status === 'BUSY') {
      rt.stats.busy++;
      notify(rt.hooks, 'onBusy', key, reply.leaseLeft);
      busy.push(
        rt.conn.get(stored[i]!).then(
          (record) => void (out[i] = { key, status: 'busy', attempt: reply.attempt, error: busyError(key, reply.attempt, reply.leaseLeft, record) }),
          () => void (out[i] = { key, status: 'busy', attempt: reply.attempt, error: busyError(key, reply.attempt, reply.leaseLeft, null) }),
        ),
      );
    } else {
      const step = claimed(reply, key, rt.stats, rt.hooks);
      if (step.next === 'run') {
        holdLease(step.job, sent + s.lease);
        (acks && !acks[i]!.durable ? unacked : granted).push({ i, job: step.job });
      }
      else if (step.next === 'replay') {
        try {
          const value = step.result === null ? undefined : (s.codec.decode(step.result) as T);
          // as process(): a replay whose primary's writes are not acknowledged is not to be acknowledged yet
          const undurable = claimNotDurable(reply, key, acks?.[i], rt.stats, value);
          if (undurable) {
            out[i] = { key, status: 'not_durable', value, attempt: step.attempt, error: undurable };
          } else {
            countReplay(key, step.attempt, rt.stats, rt.hooks);
            out[i] = { key, status: 'replayed', value, attempt: step.attempt, resultStored: step.result !== null };
          }
        } catch (error) {
          out[i] = { key, status: 'error', attempt: step.attempt, error };
        }
      } else out[i] = { key, status: reply.status === 'MISMATCH' ? 'mismatch' : 'exhausted', attempt: reply.attempt, error: step.error };
    }
  });
  if (unacked.length) {
    // Not acknowledged: given back before any work ran; the redelivery retries.
    await releaseMany(rt.conn, unacked.map((g) => ({ key: stored[g.i]!, token: g.job.token })), undefined, { once: true, deadline: s.doneTimeout }).catch(() => undefined);
    for (const { i, job } of unacked) {
      rt.stats.notDurable++;
      out[i] = { key: job.key, status: 'not_durable', attempt: job.attempt, error: new NotDurableError(job.key, 'claim', acks![i]!.count) };
    }
  }
  for (const { job } of granted) countRun(job, rt.stats);

  const ran: Ran<T>[] = [];
  const failed: { i: number; job: Job; error: unknown }[] = [];
  const maxResult = rt.conn.knownMaxResult ?? (await rt.conn.maxResult());
  let next = 0;
  const worker = async () => {
    while (next < granted.length) {
      const { i, job } = granted[next++]!;
      if (rt.hooks.onRun !== undefined) {
        try {
          await rt.hooks.onRun(job);
        } catch (err) {
          failed.push({ i, job, error: new HookError('onRun', err) });
          continue;
        }
      }
      const beat = rt.heartbeat.start(job, stored[i]!, s.lease, s.heartbeat);
      try {
        const value = await work(job);
        await rt.heartbeat.stop(beat);
        if (job.lost) out[i] = lostItem(job, lostReason(job));
        else ran.push({ i, job, value, ...encodeResult(s.codec, value, maxResult) });
      } catch (error) {
        await rt.heartbeat.stop(beat);
        if (job.lost) out[i] = lostItem(job, new LeaseLostError(job.key, job.attempt, { cause: error }));
        else failed.push({ i, job, error });
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(o.concurrency ?? 16, granted.length)) }, worker));

  const [, released] = await Promise.all([
    settle(rt, s, ran, stored, out),
    failed.length
      ? releaseMany(rt.conn, failed.map((f) => ({ key: stored[f.i]! , token: f.job.token })), undefined, { once: true, deadline: s.doneTimeout }).then(
          (a) => a.replies,
          () => [], // unreleased: the leases lapse
        )
      : [],
    ...busy,
  ]);
  failed.forEach((f, j) => {
    if (released[j] === true) rt.stats.released++;
    notify(rt.hooks, 'onRelease', f.job, f.error);
    out[f.i] = { key: f.job.key, status: 'failed', attempt: f.job.attempt, error: f.error };
  });
  return out;
}

const unconfirmed = <T>(r: Ran<T>, failure: unknown): BatchItem<T> => ({
  key: r.job.key,
  status: 'error',
  value: r.value,
  attempt: r.job.attempt,
  resultStored: false,
  error: new DoneUnconfirmedError(r.job.key, r.value, failure),
});

const lostItem = <T>(job: Job, error: unknown): BatchItem<T> => ({ key: job.key, status: 'lost', attempt: job.attempt, error });

/** The successes completed with doneMany (sent once, within doneTimeout), DONE resent on connection errors: process()'s rules per key. */
async function settle<T>(rt: Runtime, s: Settings, ran: Ran<T>[], stored: string[], out: BatchItem<T>[]): Promise<void> {
  let pending = ran;
  let resends = 0;
  while (pending.length) {
    let replies: (DoneReply | Error)[];
    let acks: Ack[] | undefined;
    try {
      ({ replies, acks } = await doneMany(
        rt.conn,
        pending.map((r) => ({ key: stored[r.i]!, token: r.job.token, result: r.result })),
        { retain: s.retain, bloom: s.bloom },
        undefined,
        { once: true, deadline: s.doneTimeout, durable: s.durable },
      ));
    } catch (err) {
      replies = pending.map(() => (err instanceof Error ? err : new Error(String(err))));
    }
    const again: Ran<T>[] = [];
    let retrying = false;
    await Promise.all(
      pending.map(async (r, j) => {
        const reply = replies[j]!;
        const sent = reply instanceof Error ? reply : undefined;
        const { verdict, resultDropped, failure } = await doneVerdict(rt, stored[r.i]!, r.job, sent ? undefined : (reply as DoneReply), sent);
        const job = r.job;
        switch (verdict) {
          case 'completed': {
            const dropped = r.dropped ?? (resultDropped ? 'memory' : undefined);
            const { resultStored, error } = await completed(job, r.value, dropped, r.cause, { stats: rt.stats, hooks: rt.hooks, oversize: s.oversize });
            if (acks && !acks[j]!.durable) {
              rt.stats.notDurable++;
              out[r.i] = { key: job.key, status: 'not_durable', value: r.value, attempt: job.attempt, resultStored, error: new NotDurableError(job.key, 'done', acks[j]!.count, r.value) };
            } else out[r.i] = { key: job.key, status: 'processed', value: r.value, attempt: job.attempt, resultStored, ...(error ? { error } : {}) };
            return;
          }
          case 'too-large':
            again.push({ ...r, result: undefined, dropped: 'oversize', cause: failure });
            return;
          case 'retry':
            if (resends >= s.doneRetries) out[r.i] = unconfirmed(r, failure);
            else {
              retrying = true;
              again.push(r);
            }
            return;
          case 'lost':
            out[r.i] = lostItem(job, leaseLost(job, failure, rt.stats, rt.hooks));
            return;
          case 'fail': // any other error: the record was not completed
            out[r.i] = { key: job.key, status: 'error', value: r.value, attempt: job.attempt, resultStored: false, error: failure };
        }
      }),
    );
    if (retrying) await sleep(doneBackoff(resends++));
    pending = again;
  }
}
