// The batch helpers. On the module: IDEM.MCLAIM / MDONE / MRELEASE, one call
// per slot in a cluster (one call's keys must share one) and per 10000
// keys, the answers put back in the caller's order. On the Functions
// edition, which has no batch commands, each key gets its single command,
// all sent at once (the client pipelines them): the same answers. The raw
// mclaim / mdone / mrelease are the module's commands as they are.
import * as c from './commands.js';
import type { Connection } from './connection.js';
import { planBatch } from './core.js';
import { ModuleRequiredError, replyError } from './errors.js';
import type { Arg } from './transport.js';
import type { BatchItem, Bytes, ClaimReply, DoneReply, Edition } from './types.js';

export interface ClaimManyOptions {
  /** one per key, or none */
  payloads?: Bytes[];
  maxTries?: number;
  bloom?: string;
}
export interface DoneItem {
  key: string;
  token: string;
  result?: Bytes;
}
export interface ReleaseItem {
  key: string;
  token: string;
}
export interface DoneManyOptions {
  /** ms, whole seconds */
  retain?: number;
  bloom?: string;
}

/** Runs one call per group (or, on the Functions edition unless `raw`, one single call per key) and answers in key order. */
async function run<T>(
  conn: Connection,
  keys: string[],
  batch: (indices: number[]) => Arg[],
  single: (edition: Edition, i: number) => Arg[],
  parse: (element: unknown) => T,
  raw: string | undefined,
): Promise<BatchItem<T>[]> {
  const edition = await conn.edition();
  const out: BatchItem<T>[] = new Array(keys.length);
  if (edition === 'functions') {
    if (raw) throw new ModuleRequiredError(`${raw} needs the redis-idem module: on the Functions edition use the *Many helpers`);
    await Promise.all(
      keys.map((key, i) =>
        conn.send(key, (e) => single(e, i), parse).then(
          (value) => (out[i] = value),
          (err) => (out[i] = replyError(err)),
        ),
      ),
    );
    return out;
  }
  await Promise.all(
    planBatch(keys, conn.transport.cluster).map(async (indices) => {
      const replies = await conn.send(keys[indices[0]!], () => batch(indices), (r) => c.parseBatch(r, parse));
      indices.forEach((index, j) => (out[index] = replies[j]!));
    }),
  );
  return out;
}

export function claimMany(conn: Connection, keys: string[], lease: number, o: ClaimManyOptions = {}, raw?: string): Promise<BatchItem<ClaimReply>[]> {
  if (o.payloads && o.payloads.length !== keys.length) throw new TypeError('claimMany: one payload per key');
  c.seconds(lease, 'lease');
  return run(
    conn,
    keys,
    (ix) => c.mclaimArgs(ix.map((i) => keys[i]!), lease, { payloads: o.payloads && ix.map((i) => o.payloads![i]!), maxTries: o.maxTries, bloom: o.bloom }),
    (e, i) => c.claimArgs(e, keys[i]!, lease, { payload: o.payloads?.[i], maxTries: o.maxTries, bloom: o.bloom }),
    c.parseClaim,
    raw,
  );
}

export async function doneMany(conn: Connection, items: DoneItem[], o: DoneManyOptions = {}, raw?: string): Promise<BatchItem<DoneReply>[]> {
  if (o.retain !== undefined) c.seconds(o.retain, 'retain');
  // RESULTS is all keys or none: the items with a result and those without go in separate calls.
  const out: BatchItem<DoneReply>[] = new Array(items.length);
  const indexed = items.map((item, i) => [item, i] as const);
  const parts = [indexed.filter(([item]) => item.result !== undefined), indexed.filter(([item]) => item.result === undefined)];
  await Promise.all(
    parts
      .filter((part) => part.length)
      .map(async (part) => {
        const list = part.map(([item]) => item);
        const replies = await run(
          conn,
          list.map((item) => item.key),
          (ix) => c.mdoneArgs(ix.map((i) => list[i]!), o),
          (e, i) => c.doneArgs(e, list[i]!.key, list[i]!.token, { result: list[i]!.result, retain: o.retain, bloom: o.bloom }),
          c.parseDone,
          raw,
        );
        part.forEach(([, index], j) => (out[index] = replies[j]!));
      }),
  );
  return out;
}

export function releaseMany(conn: Connection, items: ReleaseItem[], raw?: string): Promise<BatchItem<boolean>[]> {
  return run(
    conn,
    items.map((item) => item.key),
    (ix) => c.mreleaseArgs(ix.map((i) => items[i]!)),
    (e, i) => c.releaseArgs(e, items[i]!.key, items[i]!.token),
    c.parseBoolean,
    raw,
  );
}
