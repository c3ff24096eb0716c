// The batch commands IDEM.MCLAIM / MDONE / MRELEASE: keys grouped by slot in
// a cluster (one call's keys must share one) and cut into calls of at most
// 10000 keys, the answers put back in the caller's order. The Functions
// edition has no batch commands: there each key gets its single command
// (sent together, so the client pipelines them).
import calculateSlot from 'cluster-key-slot';
import * as c from './commands.js';
import { ExhaustedError, LeaseLostError, MismatchError, StaleError, replyError } from './errors.js';
import { Heartbeat, type Idem, type ProcessContext } from './idem.js';
import type { Arg } from './transport.js';
import type { BatchItem, Bytes, ClaimReply, DoneReply, Edition } from './types.js';

/** The most keys one batch call takes (the module's numkeys limit). */
export const MAX_BATCH_KEYS = 10000;

export type BatchEntry = string | { key: string; payload?: Bytes };

export interface BatchOptions<T> {
  lease?: number;
  maxTries?: number;
  retain?: number;
  /** how many `fn` run at once (16) */
  concurrency?: number;
  /** EXTEND interval in ms for the keys being worked on (a third of the lease), or false */
  heartbeat?: number | false;
  serializer?: import('./serializer.js').Serializer<T>;
}

/** One key's outcome in processBatch(), in the entries' order. */
export type BatchOutcome<T> =
  | { key: string; status: 'processed'; value: T; attempt: number; resultStored: boolean }
  | { key: string; status: 'replayed'; value: T | undefined; attempt: number; resultStored: boolean }
  | { key: string; status: 'busy'; attempt: number; leaseMs: number }
  | { key: string; status: 'failed' | 'lost' | 'error'; attempt?: number; error: unknown }
  | { key: string; status: 'mismatch' | 'exhausted'; attempt: number; error: Error };

export class BatchRunner {
  constructor(private readonly idem: Idem) {}

  /** Indices of `keys` grouped into calls: by slot in a cluster, at most MAX_BATCH_KEYS each. */
  groups(keys: string[]): number[][] {
    const bySlot = new Map<number, number[]>();
    keys.forEach((key, i) => {
      const slot = this.idem.transport.cluster ? calculateSlot(key) : 0;
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

  /** Runs one call per group (or one single call per key on the Functions edition) and answers in key order. */
  async #run<T>(
    keys: string[],
    batch: (indices: number[]) => Arg[],
    single: (edition: Edition, i: number) => Arg[],
    parse: (element: unknown) => T,
  ): Promise<BatchItem<T>[]> {
    const edition = await this.idem.edition();
    const out: BatchItem<T>[] = new Array(keys.length);
    if (edition === 'functions') {
      await Promise.all(
        keys.map((key, i) =>
          this.idem.send(key, (e) => single(e, i), parse).then(
            (value) => (out[i] = value),
            (err) => (out[i] = replyError(err)),
          ),
        ),
      );
      return out;
    }
    await Promise.all(
      this.groups(keys).map(async (indices) => {
        const replies = await this.idem.send(keys[indices[0]!], () => batch(indices), (r) => c.parseBatch(r, parse));
        indices.forEach((index, j) => (out[index] = replies[j]!));
      }),
    );
    return out;
  }

  mclaim(keys: string[], lease: number, o: { payloads?: Bytes[]; maxTries?: number; bloom?: string }): Promise<BatchItem<ClaimReply>[]> {
    if (o.payloads && o.payloads.length !== keys.length) throw new TypeError('mclaim: one payload per key');
    const full = keys.map((k) => this.idem.key(k));
    const bloom = o.bloom === undefined ? undefined : this.idem.key(o.bloom);
    return this.#run(
      full,
      (ix) => c.mclaimArgs(ix.map((i) => full[i]!), lease, { payloads: o.payloads && ix.map((i) => o.payloads![i]!), maxTries: o.maxTries, bloom }),
      (e, i) => c.claimArgs(e, full[i]!, lease, { payload: o.payloads?.[i], maxTries: o.maxTries, bloom }),
      c.parseClaim,
    );
  }

  async mdone(items: { key: string; token: string; result?: Bytes }[], o: { retain?: number; bloom?: string }): Promise<BatchItem<DoneReply>[]> {
    // RESULTS is all keys or none: the keys with a result and those without go in separate calls.
    const out: BatchItem<DoneReply>[] = new Array(items.length);
    const bloom = o.bloom === undefined ? undefined : this.idem.key(o.bloom);
    const parts = [items.map((item, i) => [item, i] as const).filter(([item]) => item.result !== undefined),
      items.map((item, i) => [item, i] as const).filter(([item]) => item.result === undefined)];
    await Promise.all(
      parts.filter((part) => part.length).map(async (part) => {
        const full = part.map(([item]) => ({ ...item, key: this.idem.key(item.key) }));
        const replies = await this.#run(
          full.map((item) => item.key),
          (ix) => c.mdoneArgs(ix.map((i) => full[i]!), { retain: o.retain, bloom }),
          (e, i) => c.doneArgs(e, full[i]!.key, full[i]!.token, { result: full[i]!.result, retain: o.retain, bloom }),
          c.parseDone,
        );
        part.forEach(([, index], j) => (out[index] = replies[j]!));
      }),
    );
    return out;
  }

  mrelease(items: { key: string; token: string }[]): Promise<BatchItem<boolean>[]> {
    const full = items.map((item) => ({ ...item, key: this.idem.key(item.key) }));
    return this.#run(
      full.map((item) => item.key),
      (ix) => c.mreleaseArgs(ix.map((i) => full[i]!)),
      (e, i) => c.releaseArgs(e, full[i]!.key, full[i]!.token),
      c.parseBoolean,
    );
  }

  /**
   * Claims every entry with MCLAIM, runs `fn` for the granted ones (at most
   * `concurrency` at once, their leases extended while they run), then
   * completes the successes with MDONE and releases the failures with
   * MRELEASE. Nothing waits on BUSY here: those entries answer `busy`.
   */
  async process<T>(entries: BatchEntry[], fn: (ctx: ProcessContext) => T | Promise<T>, o: BatchOptions<T>): Promise<BatchOutcome<T>[]> {
    const idem = this.idem;
    const lease = o.lease ?? idem.options.lease ?? 30;
    const serializer = (o.serializer ?? idem.serializer) as import('./serializer.js').Serializer<T>;
    const list = entries.map((e) => (typeof e === 'string' ? { key: e } : e));
    const keys = list.map((e) => e.key);
    const withPayload = list.filter((e) => e.payload !== undefined).length;
    if (withPayload !== 0 && withPayload !== list.length) throw new TypeError('processBatch: give a payload for every entry or for none');
    const hasPayload = withPayload > 0;
    const claims = await this.mclaim(keys, lease, {
      payloads: hasPayload ? list.map((e) => e.payload ?? '') : undefined,
      maxTries: o.maxTries,
    });
    const out: BatchOutcome<T>[] = new Array(list.length);
    const granted: { i: number; token: string; attempt: number; status: 'NEW' | 'SEEN' | 'RETRY' }[] = [];
    claims.forEach((reply, i) => {
      const key = keys[i]!;
      if (reply instanceof Error) out[i] = { key, status: 'error', error: reply };
      else if (reply.status === 'DONE') {
        idem.stats.replays++;
        const resultStored = reply.result !== null;
        idem.hook('onReplay', { key, attempt: reply.attempt, resultStored, waited: false });
        out[i] = { key, status: 'replayed', value: reply.result === null ? undefined : serializer.deserialize(reply.result), attempt: reply.attempt, resultStored };
      } else if (reply.status === 'BUSY') {
        idem.stats.busy++;
        out[i] = { key, status: 'busy', attempt: reply.attempt, leaseMs: reply.leaseMs };
      } else if (reply.status === 'MISMATCH') {
        idem.stats.mismatches++;
        out[i] = { key, status: 'mismatch', attempt: reply.attempt, error: new MismatchError(key, reply.attempt) };
      } else if (reply.status === 'EXHAUSTED') {
        idem.stats.exhausted++;
        out[i] = { key, status: 'exhausted', attempt: reply.attempt, error: new ExhaustedError(key, reply.attempt) };
      } else if (reply.status === 'NEW' || reply.status === 'SEEN' || reply.status === 'RETRY') {
        granted.push({ i, token: reply.token, attempt: reply.attempt, status: reply.status });
      }
    });

    const heartbeat = new Heartbeat(idem, o.heartbeat === false ? 0 : (o.heartbeat ?? (lease * 1000) / 3));
    const succeeded: { i: number; token: string; attempt: number; value: T; result?: Bytes; started: number }[] = [];
    const failed: { i: number; token: string; attempt: number; error: unknown }[] = [];
    let next = 0;
    const worker = async () => {
      while (next < granted.length) {
        const g = granted[next++]!;
        const key = keys[g.i]!;
        heartbeat.add(key, g.token, lease, () => new LeaseLostError(key, g.attempt));
        const signal = heartbeat.signal(key);
        const started = Date.now();
        try {
          const value = await fn({ key, attempt: g.attempt, status: g.status, token: g.token, signal });
          if (signal.aborted) throw signal.reason;
          succeeded.push({ ...g, value, result: await idem.serializeResult(key, serializer.serialize(value)), started });
        } catch (error) {
          if (signal.aborted) {
            idem.stats.leaseLost++;
            idem.hook('onLeaseLost', { key, attempt: g.attempt });
            out[g.i] = { key, status: 'lost', attempt: g.attempt, error: signal.reason };
          } else failed.push({ ...g, error });
        } finally {
          heartbeat.delete(key);
        }
      }
    };
    await Promise.all(Array.from({ length: Math.max(1, Math.min(o.concurrency ?? 16, granted.length)) }, worker));
    await heartbeat.stop();

    const [doneReplies, releaseReplies] = await Promise.all([
      succeeded.length
        ? this.mdone(succeeded.map((s) => ({ key: keys[s.i]!, token: s.token, result: s.result })), { retain: o.retain })
        : Promise.resolve([]),
      failed.length ? this.mrelease(failed.map((f) => ({ key: keys[f.i]!, token: f.token }))) : Promise.resolve([]),
    ]);
    succeeded.forEach((s, j) => {
      const key = keys[s.i]!;
      const reply = doneReplies[j]!;
      if (reply instanceof Error) {
        if (reply instanceof StaleError) {
          idem.stats.leaseLost++;
          idem.hook('onLeaseLost', { key, attempt: s.attempt });
          out[s.i] = { key, status: 'lost', attempt: s.attempt, error: new LeaseLostError(key, s.attempt, { cause: reply }) };
        } else out[s.i] = { key, status: 'error', attempt: s.attempt, error: reply };
        return;
      }
      if (reply.alreadyDone) {
        idem.stats.leaseLost++;
        idem.hook('onLeaseLost', { key, attempt: s.attempt });
        out[s.i] = { key, status: 'lost', attempt: s.attempt, error: new LeaseLostError(key, s.attempt) };
        return;
      }
      if (reply.resultDropped) idem.stats.resultsDropped++;
      const resultStored = reply.completed && s.result !== undefined && !reply.resultDropped;
      idem.stats.firstRuns++;
      const status = granted.find((g) => g.i === s.i)!.status;
      idem.hook('onFirstRun', { key, attempt: s.attempt, status, durationMs: Date.now() - s.started, resultStored });
      out[s.i] = { key, status: 'processed', value: s.value, attempt: s.attempt, resultStored };
    });
    failed.forEach((f, j) => {
      const key = keys[f.i]!;
      void releaseReplies[j];
      idem.stats.released++;
      idem.hook('onRelease', { key, attempt: f.attempt, error: f.error });
      out[f.i] = { key, status: 'failed', attempt: f.attempt, error: f.error };
    });
    return out;
  }
}
