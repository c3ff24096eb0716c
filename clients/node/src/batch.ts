// The batch helpers. On the module: IDEM.MCLAIM / MDONE / MRELEASE, one call
// per slot in a cluster (one call's keys must share one) and per 10000
// keys, the answers put back in the caller's order. On the Functions
// edition, which has no batch commands, each key gets its single command,
// all sent at once (the client pipelines them): the same answers. With
// `durable`, each slot's commands go on one connection followed by one WAIT
// (docs/clients.md, "Durability": batches wait once). The raw mclaim /
// mdone / mrelease are the module's commands as they are.
import type { Ack, Connection } from './connection.js';
import * as c from './commands.js';
import { acknowledged, chunk, claimNotDurable, groupBySlot, waitArgs } from './core.js';
import type { Stats } from './core.js';
import { ModuleRequiredError, NotDurableError, replyError } from './errors.js';
import type { DurableSettings } from './settings.js';
import type { Arg } from './transport.js';
import type { BatchReply, Bytes, ClaimReply, DoneReply, Edition } from './types.js';

export interface ClaimManyOptions {
  /** one per key, or none */
  payloads?: Bytes[];
  maxTries?: number;
  bloom?: string;
  /** OWNER for every key of the call */
  owner?: string;
}
/** One item of doneMany / mdone: the key (without the prefix), its claim's token, the result to store. */
export interface DoneItem {
  key: string;
  token: string;
  result?: Bytes;
}
/** One item of releaseMany / mrelease. */
export interface ReleaseItem {
  key: string;
  token: string;
}
export interface DoneManyOptions {
  /** ms, whole seconds */
  retain?: number;
  bloom?: string;
}

/** One command of a batch: the items it answers for, and whether it is a single command (one reply) or a batch one (one element each). */
interface Call {
  indices: number[];
  args: Arg[];
  single: boolean;
}

/** How a batch is sent: `durable` waits once per slot; `once` and `deadline` for the loop's DONEs and RELEASEs. */
export interface SendOptions {
  durable?: DurableSettings;
  once?: boolean;
  deadline?: number;
}

/** The answers of a batch, one per item, and with `durable` WAIT's answer for each item's slot. */
export interface Answered<T> {
  replies: BatchReply<T>[];
  acks?: Ack[];
}

/** A single command's reply or a batch one's elements, for `call`'s items. */
function spread<T>(call: Call, reply: unknown, parse: (element: unknown) => T, out: BatchReply<T>[]): void {
  if (call.single) {
    out[call.indices[0]!] = reply instanceof Error ? replyError(reply) : parse(reply);
    return;
  }
  if (reply instanceof Error) throw reply; // the whole command refused (not one key)
  const elements = c.parseBatch(reply, parse);
  call.indices.forEach((index, j) => (out[index] = elements[j]!));
}

/**
 * Sends the calls `plan` makes of each slot's items (the Functions edition:
 * a single command per key; a failed single is its item's error) and
 * answers in item order.
 */
async function run<T>(
  conn: Connection,
  keys: string[],
  plan: (edition: Edition, group: number[]) => Call[],
  parse: (element: unknown) => T,
  o: SendOptions = {},
): Promise<Answered<T>> {
  const edition = conn.known ?? (await conn.edition());
  const out: BatchReply<T>[] = new Array(keys.length);
  const acks: Ack[] | undefined = o.durable ? new Array(keys.length) : undefined;
  const mode = o.once ? 'once' : undefined;
  const timed = <R>(p: Promise<R>, what: string) => (o.deadline ? conn.clock.deadline(p, o.deadline, what) : p);
  await Promise.all(
    groupBySlot(keys, conn.transport.cluster).map(async (group) => {
      const calls = plan(edition, group);
      const key = keys[group[0]!];
      if (o.durable) {
        const replies = await timed(conn.pipeline(key, [...calls.map((call) => call.args), waitArgs(o.durable)], mode), 'a batch and its WAIT');
        calls.forEach((call, j) => spread(call, replies[j], parse, out));
        const ack = acknowledged(o.durable, replies[calls.length]);
        for (const index of group) acks![index] = ack;
        return;
      }
      await Promise.all(
        calls.map(async (call) => {
          const send = conn.send(keys[call.indices[0]!], () => call.args, (r) => r, mode);
          if (!call.single) return spread(call, await timed(send, String(call.args[0])), parse, out);
          await timed(send, String(call.args[0])).then(
            (reply) => spread(call, reply, parse, out),
            (err: unknown) => (out[call.indices[0]!] = replyError(err)),
          );
        }),
      );
    }),
  );
  return { replies: out, acks };
}

const moduleOnly = (raw: string | undefined, edition: Edition) => {
  if (raw && edition === 'functions') throw new ModuleRequiredError(`${raw} needs the redis-idem module: on the Functions edition use the *Many helpers`);
};

export function claimMany(conn: Connection, keys: string[], lease: number, o: ClaimManyOptions = {}, raw?: string, send: SendOptions = {}): Promise<Answered<ClaimReply>> {
  if (o.payloads && o.payloads.length !== keys.length) throw new TypeError('claimMany: one payload per key');
  c.seconds(lease, 'lease');
  const plan = (edition: Edition, group: number[]): Call[] => {
    moduleOnly(raw, edition);
    if (edition === 'functions') {
      return group.map((i) => ({ indices: [i], single: true, args: c.claimArgs(edition, keys[i]!, lease, { payload: o.payloads?.[i], maxTries: o.maxTries, bloom: o.bloom, owner: o.owner }) }));
    }
    return chunk(group).map((ix) => ({
      indices: ix,
      single: false,
      args: c.mclaimArgs(ix.map((i) => keys[i]!), lease, { payloads: o.payloads && ix.map((i) => o.payloads![i]!), maxTries: o.maxTries, bloom: o.bloom, owner: o.owner }),
    }));
  };
  return run(conn, keys, plan, c.parseClaim, send);
}

export async function doneMany(conn: Connection, items: DoneItem[], o: DoneManyOptions = {}, raw?: string, send: SendOptions = {}): Promise<Answered<DoneReply>> {
  if (o.retain !== undefined) c.seconds(o.retain, 'retain');
  const plan = (edition: Edition, group: number[]): Call[] => {
    moduleOnly(raw, edition);
    if (edition === 'functions') {
      return group.map((i) => ({ indices: [i], single: true, args: c.doneArgs(edition, items[i]!.key, items[i]!.token, { result: items[i]!.result, retain: o.retain, bloom: o.bloom }) }));
    }
    // RESULTS is all keys or none: the items with a result and those without go in separate calls.
    const parts = [group.filter((i) => items[i]!.result !== undefined), group.filter((i) => items[i]!.result === undefined)];
    return parts
      .filter((part) => part.length)
      .flatMap(chunk)
      .map((ix) => ({ indices: ix, single: false, args: c.mdoneArgs(ix.map((i) => items[i]!), o) }));
  };
  return run(conn, items.map((item) => item.key), plan, c.parseDone, send);
}

export function releaseMany(conn: Connection, items: ReleaseItem[], raw?: string, send: SendOptions = {}): Promise<Answered<boolean>> {
  const plan = (edition: Edition, group: number[]): Call[] => {
    moduleOnly(raw, edition);
    if (edition === 'functions') return group.map((i) => ({ indices: [i], single: true, args: c.releaseArgs(edition, items[i]!.key, items[i]!.token) }));
    return chunk(group).map((ix) => ({ indices: ix, single: false, args: c.mreleaseArgs(ix.map((i) => items[i]!)) }));
  };
  return run(conn, items.map((item) => item.key), plan, c.parseBoolean, send);
}

/**
 * The typed helpers' answers with `durable` (core's claimNotDurable, as
 * process() reads a claim's WAIT): a claim granted but not acknowledged is
 * released (one releaseMany) and answered NotDurableError (stage 'claim');
 * a key answered DONE whose WAIT fell short is answered NotDurableError
 * (stage 'done', its `result` the stored bytes), nothing released; a DONE
 * that completed but was not acknowledged is answered NotDurableError
 * (stage 'done').
 */
export async function durableClaims(conn: Connection, keys: string[], asGiven: string[], answered: Answered<ClaimReply>, stats: Stats): Promise<BatchReply<ClaimReply>[]> {
  const { replies, acks } = answered;
  if (!acks) return replies;
  const releases: ReleaseItem[] = [];
  replies.forEach((reply, i) => {
    if (reply instanceof Error) return;
    const error = claimNotDurable(reply, asGiven[i]!, acks[i]!, stats, reply.status === 'DONE' ? (reply.result ?? undefined) : undefined);
    if (error === undefined) return;
    if ('token' in reply) releases.push({ key: keys[i]!, token: reply.token });
    replies[i] = error;
  });
  if (releases.length) await releaseMany(conn, releases).catch(() => undefined);
  return replies;
}

export function durableDones(asGiven: string[], answered: Answered<DoneReply>): BatchReply<DoneReply>[] {
  const { replies, acks } = answered;
  if (!acks) return replies;
  return replies.map((reply, i) => (!(reply instanceof Error) && reply.completed && !acks[i]!.durable ? new NotDurableError(asGiven[i]!, 'done', acks[i]!.count) : reply));
}
