// processMany(keys, work): one claimMany, the work for every granted key (at
// most `concurrency` at once, one heartbeat for the batch), then one
// doneMany for the successes and one releaseMany for the failures. The
// decisions are core.ts's, the same as process()'s; a busy key is not
// waited for.
import { claimMany, doneMany, releaseMany } from './batch.js';
import {
  type DropReason,
  type Job,
  type ProcessOptions,
  type Settings,
  claimed,
  completed,
  doneBackoff,
  encodeResult,
  leaseLost,
  notify,
  settings,
} from './core.js';
import { BusyError, DoneUnconfirmedError, HookError, LeaseLostError } from './errors.js';
import { Heartbeat } from './heartbeat.js';
import { type Runtime, type Work, doneVerdict, sleep } from './loop.js';
import type { Bytes, DoneReply } from './types.js';

/** One key's outcome in processMany(), in the keys' order. */
export interface ManyItem<T> {
  key: string;
  status: 'processed' | 'replayed' | 'busy' | 'failed' | 'lost' | 'mismatch' | 'exhausted' | 'error';
  /** processed: the work's value; replayed: the stored result decoded */
  value?: T;
  /** failed: the work's error (or a HookError); lost: LeaseLostError; busy, mismatch, exhausted: their error; error: the key's error reply, or DoneUnconfirmedError (with `value`); processed: ResultNotStoredError or HookError where process() would throw it */
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

export async function processMany<T>(rt: Runtime, keys: string[], work: Work<T>, o: ProcessManyOptions<T> = {}): Promise<ManyItem<T>[]> {
  const s = settings(rt.options, o);
  const stored = keys.map((key) => rt.prefix + key);
  const bloom = s.bloom === undefined ? undefined : rt.prefix + s.bloom;
  const claims = await claimMany(rt.conn, stored, s.lease, { payloads: o.payloads, maxTries: s.maxTries, bloom });
  const out: ManyItem<T>[] = new Array(keys.length);
  const granted: { i: number; job: Job }[] = [];
  claims.forEach((reply, i) => {
    const key = keys[i]!;
    if (reply instanceof Error) out[i] = { key, status: 'error', error: reply };
    else if (reply.status === 'BUSY') {
      rt.stats.busy++;
      notify(rt.hooks, 'onBusy', key, reply.leaseLeft);
      out[i] = { key, status: 'busy', attempt: reply.attempt, error: new BusyError(key, reply.attempt, reply.leaseLeft) };
    } else {
      const step = claimed(reply, key, rt.stats, rt.hooks);
      if (step.next === 'run') granted.push({ i, job: step.job });
      else if (step.next === 'replay') {
        const value = step.result === null ? undefined : (s.codec.decode(step.result) as T);
        out[i] = { key, status: 'replayed', value, attempt: step.attempt, resultStored: step.result !== null };
      } else out[i] = { key, status: reply.status === 'MISMATCH' ? 'mismatch' : 'exhausted', attempt: reply.attempt, error: step.error };
    }
  });

  const heartbeat = new Heartbeat(rt.conn, s.lease, s.heartbeat, rt.stats, rt.hooks);
  const ran: Ran<T>[] = [];
  const failed: { i: number; job: Job; error: unknown }[] = [];
  const maxResult = await rt.conn.maxResult();
  let next = 0;
  const worker = async () => {
    while (next < granted.length) {
      const { i, job } = granted[next++]!;
      try {
        await rt.hooks.onRun?.(job);
      } catch (err) {
        failed.push({ i, job, error: new HookError('onRun', err) });
        continue;
      }
      heartbeat.add(job, stored[i]!);
      try {
        const value = await work(job);
        heartbeat.delete(job);
        if (job.lost) out[i] = lostItem(job, job.signal.reason);
        else ran.push({ i, job, value, ...encodeResult(s.codec, value, maxResult) });
      } catch (error) {
        heartbeat.delete(job);
        if (job.lost) out[i] = lostItem(job, new LeaseLostError(job.key, job.attempt, { cause: error }));
        else failed.push({ i, job, error });
      }
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(o.concurrency ?? 16, granted.length)) }, worker));
  await heartbeat.stop();

  await Promise.all([
    settle(rt, s, ran, stored, bloom, out),
    failed.length
      ? releaseMany(rt.conn, failed.map((f) => ({ key: stored[f.i]!, token: f.job.token }))).catch(() => undefined) // unreleased: the leases lapse
      : undefined,
  ]);
  for (const f of failed) {
    rt.stats.released++;
    notify(rt.hooks, 'onRelease', f.job, f.error);
    out[f.i] = { key: f.job.key, status: 'failed', attempt: f.job.attempt, error: f.error };
  }
  return out;
}

const unconfirmed = <T>(r: Ran<T>, failure: unknown): ManyItem<T> => ({
  key: r.job.key,
  status: 'error',
  value: r.value,
  attempt: r.job.attempt,
  resultStored: false,
  error: new DoneUnconfirmedError(r.job.key, r.value, failure),
});

const lostItem = <T>(job: Job, error: unknown): ManyItem<T> => ({ key: job.key, status: 'lost', attempt: job.attempt, error });

/** The successes completed with doneMany, DONE resent on connection errors: process()'s rules per key. */
async function settle<T>(rt: Runtime, s: Settings, ran: Ran<T>[], stored: string[], bloom: string | undefined, out: ManyItem<T>[]): Promise<void> {
  let pending = ran;
  let resends = 0;
  while (pending.length) {
    let replies: (DoneReply | Error)[];
    try {
      replies = await doneMany(rt.conn, pending.map((r) => ({ key: stored[r.i]!, token: r.job.token, result: r.result })), { retain: s.retain, bloom });
    } catch (err) {
      replies = pending.map(() => (err instanceof Error ? err : new Error(String(err))));
    }
    const again: Ran<T>[] = [];
    let retrying = false;
    await Promise.all(
      pending.map(async (r, j) => {
        const reply = replies[j]!;
        const failure = reply instanceof Error ? reply : undefined;
        const { verdict, resultDropped } = await doneVerdict(rt, stored[r.i]!, r.job, failure ? undefined : (reply as DoneReply), failure);
        const job = r.job;
        switch (verdict) {
          case 'completed': {
            const dropped = r.dropped ?? (resultDropped ? 'memory' : undefined);
            const { resultStored, error } = await completed(job, r.value, dropped, r.cause, { stats: rt.stats, hooks: rt.hooks, oversize: s.oversize });
            out[r.i] = { key: job.key, status: 'processed', value: r.value, attempt: job.attempt, resultStored, ...(error ? { error } : {}) };
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
          case 'fail':
            out[r.i] = unconfirmed(r, failure);
        }
      }),
    );
    if (retrying) await sleep(doneBackoff(resends++));
    pending = again;
  }
}
