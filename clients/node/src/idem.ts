// The Idem class: the client given (ioredis, node-redis, or a Transport),
// the typed commands on either edition with the instance's prefix, the
// batch helpers, and the consumer loop (loop.ts, many.ts). Everything the
// loop needs per call is made here, once: the settings, the connection
// (its edition once known), the one clock, the heartbeat, the coalescer.
import * as batch from './batch.js';
import { Clock } from './clock.js';
import * as c from './commands.js';
import { Connection } from './connection.js';
import { type Hooks, type Stats, newStats } from './core.js';
import { Heartbeat } from './heartbeat.js';
import { type IoredisOptions, ioredisTransport, isIoredis } from './ioredis.js';
import { type Outcome, type Runtime, type Work, process } from './loop.js';
import { type BatchItem, type ProcessManyOptions, processMany } from './many.js';
import { isNodeRedis, nodeRedisTransport } from './node-redis.js';
import { type IdemOptions as CoreOptions, type ProcessOptions, type Settings, instanceSettings } from './settings.js';
import { Coalescer } from './tick.js';
import type { Transport } from './transport.js';
import type { BatchReply, Bytes, ClaimOptions, ClaimReply, DoneOptions, DoneReply, Edition, FilterInfo, RecordInfo, ReserveOptions, ScanOptions } from './types.js';

const settingsOf = new WeakMap<Idem, Settings>();
const runtimeOf = new WeakMap<Idem, Runtime>();

/** The instance's resolved settings (the middleware takes its defaults from them). */
export const idemSettings = (idem: Idem): Settings => settingsOf.get(idem)!;

/** The instance's loop parts (the broker adapters run the loop with them). */
export function idemRuntime(idem: unknown): Runtime {
  const rt = runtimeOf.get(idem as Idem);
  if (rt === undefined) throw new TypeError('redis-idem: the adapter takes an Idem instance (new Idem(client, options))');
  return rt;
}

/** A prefix as a SCAN glob that matches it literally. */
const literalGlob = (prefix: string) => prefix.replace(/[*?[\]\\]/g, '\\$&');

export interface IdemOptions extends CoreOptions {
  /** for an ioredis Cluster: ioredis's Command class (found with import('ioredis') if not given) */
  ioredis?: IoredisOptions;
}

/** idempotent()'s options: the key (and payload) from the call's arguments, and process()'s options. */
export interface IdempotentOptions<A extends unknown[], T> extends Omit<ProcessOptions<T>, 'payload'> {
  /** the record's key, from the call's arguments */
  key: (...args: A) => string;
  /** PAYLOAD, from the call's arguments (none if not given) */
  payload?: (...args: A) => Bytes;
}

export class Idem {
  readonly #conn: Connection;
  readonly #runtime: Runtime;
  readonly prefix: string;
  readonly stats: Stats = newStats();
  readonly hooks: Hooks;

  /**
   * `client`: an ioredis Redis (Sentinel too: `{ sentinels, name }`) or
   * Cluster, a node-redis client, cluster (v4, v5) or sentinel
   * (`createSentinel`, v5), or a Transport.
   */
  constructor(client: unknown, options: IdemOptions = {}) {
    const settings = instanceSettings(options);
    let transport: Transport;
    if (isIoredis(client)) transport = ioredisTransport(client, options.ioredis);
    else if (isNodeRedis(client)) transport = nodeRedisTransport(client);
    else if (client && typeof (client as Transport).send === 'function') transport = client as Transport;
    else throw new TypeError('redis-idem: pass an ioredis client or Cluster, a node-redis client, cluster or sentinel, or a Transport');
    this.prefix = options.prefix ?? '';
    this.hooks = options.hooks ?? {};
    settingsOf.set(this, settings);
    const clock = new Clock();
    this.#conn = new Connection(transport, clock, options.edition, options.maxResult);
    this.#runtime = {
      conn: this.#conn,
      coalescer: new Coalescer(this.#conn),
      heartbeat: new Heartbeat(this.#conn, clock, this.stats, this.hooks),
      prefix: this.prefix,
      settings,
      stats: this.stats,
      hooks: this.hooks,
    };
    runtimeOf.set(this, this.#runtime);
  }

  /** Which edition the server runs: 'module' or 'functions' (asked once). */
  edition(): Promise<Edition> {
    return this.#conn.edition();
  }

  /** Closes the connections this instance opened for WAIT, and stops its timer (never the client you gave it). */
  async close(): Promise<void> {
    this.#conn.clock.stop();
    await this.#conn.transport.close?.();
  }

  /**
   * The consumer loop in one call (docs/clients.md, "What process does"):
   * claims `key`, runs `work(job)` once with a heartbeat, completes the
   * record with its result (or gives the claim back when it throws), and
   * replays the stored result to every later call.
   */
  process<T>(key: string, work: Work<T>, options?: ProcessOptions<T>): Promise<Outcome<T>> {
    return process(this.#runtime, key, work, options);
  }

  /** process() for many keys: one batch of claims, completions and releases; a busy key is not waited for. */
  processMany<T>(keys: string[], work: Work<T>, options?: ProcessManyOptions<T>): Promise<BatchItem<T>[]> {
    return processMany(this.#runtime, keys, work, options);
  }

  /**
   * `fn` wrapped: each call is process(key(...args), ...) with `fn(...args)`
   * as the work (it gets its own arguments and `this`, not the job), and
   * resolves to its value (a replay's decoded result; undefined where none
   * was stored), or rejects with what process() rejects with.
   */
  idempotent<A extends unknown[], T>(
    fn: (...args: A) => T | Promise<T>,
    options: IdempotentOptions<A, T>,
  ): (...args: A) => Promise<T | undefined> {
    const { key, payload, ...processOptions } = options;
    if (typeof fn !== 'function' || typeof key !== 'function' || (payload !== undefined && typeof payload !== 'function')) {
      throw new TypeError("redis-idem: idempotent(fn, { key, payload }) takes the function, and functions of the call's arguments");
    }
    const idem = this;
    return async function (this: unknown, ...args: A): Promise<T | undefined> {
      const call = payload === undefined ? processOptions : { ...processOptions, payload: payload(...args) };
      return (await idem.process(key(...args), () => fn.apply(this, args), call)).value;
    };
  }

  // The typed commands. Keys are given without the prefix; every duration in ms.

  #key = (key: string) => this.prefix + key;
  #bloomKey = (bloom: string | undefined) => (bloom === undefined ? undefined : this.#key(bloom));
  #bloom = <O extends { bloom?: string }>(o: O): O => (o.bloom === undefined ? o : { ...o, bloom: this.#key(o.bloom) });

  claim(key: string, lease: number, options: ClaimOptions = {}): Promise<ClaimReply> {
    return this.#conn.claim(this.#key(key), lease, this.#bloom(options));
  }

  done(key: string, token: string, options: DoneOptions = {}): Promise<DoneReply> {
    return this.#conn.done(this.#key(key), token, this.#bloom(options));
  }

  /** true: the claim was given up; false: this token did not hold a live claim. */
  release(key: string, token: string): Promise<boolean> {
    return this.#conn.release(this.#key(key), token);
  }

  /** Resolves when the lease was extended; rejects with StaleError when the token does not hold the claim. */
  extend(key: string, token: string, lease: number): Promise<void> {
    return this.#conn.extend(this.#key(key), token, lease);
  }

  get(key: string): Promise<RecordInfo | null> {
    return this.#conn.get(this.#key(key));
  }

  /**
   * Every record matching all the filters given, as keys without the prefix,
   * each primary of a cluster in turn (the server itself otherwise):
   * `for await (const key of idem.scan({ state: 'released', minTries: 3 }))`.
   * A record present for the whole scan is listed at least once (SCAN's guarantee: maybe more).
   */
  async *scan(options: ScanOptions = {}): AsyncGenerator<string> {
    const match = literalGlob(this.prefix) + (options.match ?? '*');
    for await (const key of this.#conn.scan({ ...options, match })) yield key.slice(this.prefix.length);
  }

  /**
   * Gives a record's work back (IDEM.REQUEUE): true when it is now released,
   * its attempt kept (the next claim is RETRY with attempt + 1) and its tries
   * restarted; false when there is no record. LiveLeaseError while its holder's lease is live.
   */
  requeue(key: string): Promise<boolean> {
    return this.#conn.requeue(this.#key(key));
  }

  /** true: the key was absent and is now done for `retain` ms; false: a record exists. */
  once(key: string, retain: number): Promise<boolean> {
    const k = this.#key(key);
    return this.#conn.send(k, (e) => c.onceArgs(e, k, retain), c.parseBoolean);
  }

  /** The date-sharded Bloom filters (module only). */
  readonly bf = {
    reserve: (key: string, errorRate: number, capacity: number, options?: ReserveOptions): Promise<void> =>
      this.#filter(key, (e, k) => c.reserveArgs(e, k, errorRate, capacity, options), () => undefined),
    add: (key: string, item: Bytes): Promise<boolean> => this.#filter(key, (e, k) => c.bfAddArgs(e, k, item), c.parseBoolean),
    madd: (key: string, items: Bytes[]): Promise<boolean[]> => this.#filter(key, (e, k) => c.bfMaddArgs(e, k, items), c.parseBooleans),
    exists: (key: string, item: Bytes): Promise<boolean> => this.#filter(key, (e, k) => c.bfExistsArgs(e, k, item), c.parseBoolean),
    mexists: (key: string, items: Bytes[]): Promise<boolean[]> => this.#filter(key, (e, k) => c.bfMexistsArgs(e, k, items), c.parseBooleans),
    info: (key: string): Promise<FilterInfo | null> => this.#filter(key, (e, k) => c.bfInfoArgs(e, k), c.parseFilterInfo),
  };

  #filter<T>(key: string, build: (e: Edition, k: string) => (string | Buffer | number)[], parse: (r: unknown) => T): Promise<T> {
    const k = this.#key(key);
    return this.#conn.send(k, (e) => build(e, k), parse);
  }

  // The batch helpers, on both editions: one answer per key, in order; a
  // key's error is an Error element. With `durable`, one WAIT per slot: a
  // claim granted but not acknowledged is released and answered
  // NotDurableError, a DONE not acknowledged is answered NotDurableError.

  async claimMany(keys: string[], lease: number, options: batch.ClaimManyOptions = {}): Promise<BatchReply<ClaimReply>[]> {
    const s = settingsOf.get(this)!;
    const stored = keys.map(this.#key);
    const o = { ...options, bloom: this.#bloomKey(options.bloom), owner: options.owner ?? s.owner };
    return batch.durableClaims(this.#conn, stored, keys, await batch.claimMany(this.#conn, stored, lease, o, undefined, { durable: s.durable }), this.stats);
  }

  async doneMany(items: batch.DoneItem[], options: batch.DoneManyOptions = {}): Promise<BatchReply<DoneReply>[]> {
    const s = settingsOf.get(this)!;
    const answered = await batch.doneMany(this.#conn, this.#items(items), this.#bloom(options), undefined, { durable: s.durable });
    return batch.durableDones(items.map((item) => item.key), answered);
  }

  async releaseMany(items: batch.ReleaseItem[]): Promise<BatchReply<boolean>[]> {
    return (await batch.releaseMany(this.#conn, this.#items(items))).replies;
  }

  // The module's batch commands as they are (ModuleRequiredError on the Functions edition).

  async mclaim(keys: string[], lease: number, options: batch.ClaimManyOptions = {}): Promise<BatchReply<ClaimReply>[]> {
    return (await batch.claimMany(this.#conn, keys.map(this.#key), lease, this.#bloom(options), 'IDEM.MCLAIM')).replies;
  }

  async mdone(items: batch.DoneItem[], options: batch.DoneManyOptions = {}): Promise<BatchReply<DoneReply>[]> {
    return (await batch.doneMany(this.#conn, this.#items(items), this.#bloom(options), 'IDEM.MDONE')).replies;
  }

  async mrelease(items: batch.ReleaseItem[]): Promise<BatchReply<boolean>[]> {
    return (await batch.releaseMany(this.#conn, this.#items(items), 'IDEM.MRELEASE')).replies;
  }

  #items<I extends { key: string }>(items: I[]): I[] {
    return items.map((item) => ({ ...item, key: this.#key(item.key) }));
  }
}
