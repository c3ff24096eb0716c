// The Idem class: the typed commands on either edition, and the consumer
// loop (process, wrap) that gets every branch of the contract right.
import * as c from './commands.js';
import {
  BusyError,
  ExhaustedError,
  LeaseLostError,
  MismatchError,
  NoEditionError,
  ResultNotStoredError,
  ResultTooLargeError,
  StaleError,
  replyError,
} from './errors.js';
import { type IoredisOptions, ioredisTransport, isIoredis } from './ioredis.js';
import { isNodeRedis, nodeRedisTransport } from './node-redis.js';
import { json, type Serializer } from './serializer.js';
import { type Arg, type Transport, text } from './transport.js';
import type {
  BatchItem,
  Bytes,
  ClaimOptions,
  ClaimReply,
  DoneOptions,
  DoneReply,
  Edition,
  FilterInfo,
  GrantedStatus,
  RecordInfo,
  ReserveOptions,
} from './types.js';
import { BatchRunner, type BatchOptions, type BatchOutcome, type BatchEntry } from './batch.js';

/** The module's default idem.max-result, and the Functions edition's constant. */
export const DEFAULT_MAX_RESULT = 1048576;

/** What a result over idem.max-result becomes: `'omit'` completes the record without it; a function may store something smaller instead (a pointer, a summary). */
export type OversizePolicy = 'omit' | ((serialized: Buffer, maxResult: number, key: string) => Bytes | undefined);

/** Called as the loop goes; a hook that throws is ignored. */
export interface Hooks {
  /** the work ran for this claim (a first run, or a RETRY / SEEN) and completed */
  onFirstRun?(info: { key: string; attempt: number; status: GrantedStatus; durationMs: number; resultStored: boolean }): void;
  /** the record was done already: its stored result was replayed, the work did not run */
  onReplay?(info: { key: string; attempt: number; resultStored: boolean; waited: boolean }): void;
  /** the work threw: the claim was released for a retry */
  onRelease?(info: { key: string; attempt: number; error: unknown }): void;
  /** another worker claimed the key since (our lease had lapsed): our result was not stored */
  onLeaseLost?(info: { key: string; attempt: number }): void;
  /** the result was over idem.max-result: the oversize policy applied */
  onOversize?(info: { key: string; bytes: number; maxResult: number }): void;
  /** still BUSY when the wait ended */
  onBusy?(info: { key: string; attempt: number; leaseMs: number }): void;
}

/** Counters of what process() and processBatch() did, per instance. */
export interface Stats {
  firstRuns: number;
  replays: number;
  released: number;
  leaseLost: number;
  busy: number;
  mismatches: number;
  exhausted: number;
  oversize: number;
  resultsDropped: number;
  extends: number;
}

export interface IdemOptions {
  /** prefixed to every key this instance names (records and filters): one per tenant */
  prefix?: string;
  /** skip asking the server which edition it runs */
  edition?: Edition;
  /** result serialisation of process(); JSON by default */
  serializer?: Serializer;
  /** process()'s default lease, seconds (30) */
  lease?: number;
  /** process()'s default wait for a copy in flight, ms (5000) */
  waitMs?: number;
  /** idem.max-result, bytes: else read with CONFIG GET (module), else 1048576 */
  maxResult?: number;
  /** results over maxResult: 'omit' (default) or a function */
  oversize?: OversizePolicy;
  hooks?: Hooks;
  /** for an ioredis Cluster: ioredis's Command class (found by import('ioredis') if not given) */
  ioredis?: IoredisOptions;
}

export interface ProcessContext {
  /** the key as given (without the prefix) */
  key: string;
  /** the fencing number: pass it downstream */
  attempt: number;
  /** NEW, RETRY (an earlier attempt may have partly run), or SEEN (the BLOOM filter may have seen it complete: verify) */
  status: GrantedStatus;
  token: string;
  /** aborted when the lease is lost (another worker claimed the key) */
  signal: AbortSignal;
}

export interface ProcessOptions<T = unknown> {
  lease?: number;
  payload?: Bytes;
  maxTries?: number;
  bloom?: string;
  retain?: number;
  waitMs?: number;
  /** EXTEND interval in ms (default: a third of the lease), or false for none */
  heartbeat?: number | false;
  serializer?: Serializer<T>;
}

export interface Outcome<T> {
  /** true: the record was done already and its result replayed; false: the work ran here */
  replayed: boolean;
  /** the work's value, or the replayed one (undefined when the record kept no result) */
  value: T | undefined;
  attempt: number;
  /** the claim's status: NEW, SEEN, RETRY, or DONE for a replay */
  status: GrantedStatus | 'DONE';
  /** false when the record keeps no result (oversize, maxmemory): a replay has no value */
  resultStored: boolean;
  /** a duplicate waited for the copy in flight */
  waited: boolean;
  /** the DONE reply, when the work ran here */
  done?: DoneReply;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const MAX_WAIT_MS = 3600000;

/** Either client, or a Transport of your own. */
export type Client = unknown;

export class Idem {
  readonly transport: Transport;
  readonly prefix: string;
  readonly stats: Stats = {
    firstRuns: 0,
    replays: 0,
    released: 0,
    leaseLost: 0,
    busy: 0,
    mismatches: 0,
    exhausted: 0,
    oversize: 0,
    resultsDropped: 0,
    extends: 0,
  };
  readonly hooks: Hooks;
  readonly serializer: Serializer;
  #edition?: Promise<Edition>;
  #maxResult?: Promise<number>;

  constructor(
    client: Client,
    readonly options: IdemOptions = {},
  ) {
    if (isIoredis(client)) this.transport = ioredisTransport(client, options.ioredis);
    else if (isNodeRedis(client)) this.transport = nodeRedisTransport(client);
    else if (client && typeof (client as Transport).send === 'function') this.transport = client as Transport;
    else throw new TypeError('redis-idem: pass an ioredis client or Cluster, a node-redis client or cluster, or a Transport');
    this.prefix = options.prefix ?? '';
    this.hooks = options.hooks ?? {};
    this.serializer = options.serializer ?? json;
    if (options.edition) this.#edition = Promise.resolve(options.edition);
  }

  /** The key as stored: the instance's prefix, then `key`. */
  key(key: string): string {
    return this.prefix + key;
  }

  /** Which edition the server runs: the module (COMMAND INFO IDEM.CLAIM knows it) or the Functions library (FCALL_RO idem_edition 0). Asked once. */
  edition(): Promise<Edition> {
    this.#edition ??= this.#detect().catch((err) => {
      this.#edition = undefined;
      throw err;
    });
    return this.#edition;
  }

  async #detect(): Promise<Edition> {
    try {
      const info = (await this.transport.send(undefined, ['COMMAND', 'INFO', 'IDEM.CLAIM'])) as unknown[];
      if (Array.isArray(info) && info[0] !== null && info[0] !== undefined) return 'module';
    } catch {
      // COMMAND may be denied by ACL: the library's own probe decides.
    }
    try {
      const reply = (await this.transport.send(undefined, ['FCALL_RO', 'idem_edition', 0])) as unknown[];
      if (Array.isArray(reply) && text(reply[0]) === 'functions') return 'functions';
    } catch {
      // not loaded either
    }
    throw new NoEditionError(
      'neither the redis-idem module nor its Functions library answers on this server: load the module ' +
        '(loadmodule /path/to/libredis_idem.so) or the library (redis-cli -x FUNCTION LOAD REPLACE < functions/idem.lua)',
    );
  }

  /** idem.max-result: the option, else the module's config, else the default. */
  maxResult(): Promise<number> {
    if (this.options.maxResult !== undefined) return Promise.resolve(this.options.maxResult);
    this.#maxResult ??= this.edition().then(async (edition) => {
      if (edition === 'functions') return DEFAULT_MAX_RESULT;
      try {
        const reply = (await this.transport.send(undefined, ['CONFIG', 'GET', 'idem.max-result'])) as unknown[];
        const value = Array.isArray(reply) ? Number(text(reply[1])) : NaN;
        return Number.isFinite(value) && value > 0 ? value : DEFAULT_MAX_RESULT;
      } catch {
        return DEFAULT_MAX_RESULT; // CONFIG is often refused on managed servers
      }
    });
    return this.#maxResult;
  }

  /** Sends a command built for the server's edition; error replies come back as typed errors. */
  async send<T>(key: string | undefined, build: (edition: Edition) => Arg[], parse: (reply: unknown) => T, blocking = false): Promise<T> {
    const args = build(await this.edition());
    let reply: unknown;
    try {
      const transport = this.transport;
      reply = await (blocking && transport.sendBlocking ? transport.sendBlocking(key, args) : transport.send(key, args));
    } catch (err) {
      throw replyError(err);
    }
    return parse(reply);
  }

  // The record commands. Keys are given without the prefix.

  claim(key: string, lease: number, options: ClaimOptions = {}): Promise<ClaimReply> {
    const k = this.key(key);
    const o = { ...options, bloom: options.bloom === undefined ? undefined : this.key(options.bloom) };
    // A claim that waits runs on a connection of its own (pool.ts says why).
    return this.send(k, (e) => c.claimArgs(e, k, lease, o), c.parseClaim, !!options.wait);
  }

  /** Closes the connections this instance opened for WAIT (never the client you gave it). */
  async close(): Promise<void> {
    await this.transport.close?.();
  }

  done(key: string, token: string, options: DoneOptions = {}): Promise<DoneReply> {
    const k = this.key(key);
    const o = { ...options, bloom: options.bloom === undefined ? undefined : this.key(options.bloom) };
    return this.send(k, (e) => c.doneArgs(e, k, token, o), c.parseDone);
  }

  /** true: the claim was given up; false: this token did not hold a live claim. */
  release(key: string, token: string): Promise<boolean> {
    const k = this.key(key);
    return this.send(k, (e) => c.releaseArgs(e, k, token), c.parseBoolean);
  }

  /** Resolves when the lease was extended; rejects with StaleError when the token does not hold the claim. */
  extend(key: string, token: string, lease: number): Promise<void> {
    const k = this.key(key);
    return this.send(k, (e) => c.extendArgs(e, k, token, lease), c.parseExtend);
  }

  get(key: string): Promise<RecordInfo | null> {
    const k = this.key(key);
    return this.send(k, (e) => c.getArgs(e, k), c.parseGet);
  }

  /** true: the key was absent and is now done for `retain` seconds; false: a record exists. */
  once(key: string, retain: number): Promise<boolean> {
    const k = this.key(key);
    return this.send(k, (e) => c.onceArgs(e, k, retain), c.parseBoolean);
  }

  /** The date-sharded Bloom filters (module only: the Functions edition throws ModuleRequiredError). */
  readonly bf = {
    reserve: (key: string, errorRate: number, capacity: number, options?: ReserveOptions): Promise<void> => {
      const k = this.key(key);
      return this.send(k, (e) => c.reserveArgs(e, k, errorRate, capacity, options), () => undefined);
    },
    add: (key: string, item: Bytes): Promise<boolean> => {
      const k = this.key(key);
      return this.send(k, (e) => c.bfAddArgs(e, k, item), c.parseBoolean);
    },
    madd: (key: string, items: Bytes[]): Promise<boolean[]> => {
      const k = this.key(key);
      return this.send(k, (e) => c.bfMaddArgs(e, k, items), c.parseBooleans);
    },
    exists: (key: string, item: Bytes): Promise<boolean> => {
      const k = this.key(key);
      return this.send(k, (e) => c.bfExistsArgs(e, k, item), c.parseBoolean);
    },
    mexists: (key: string, items: Bytes[]): Promise<boolean[]> => {
      const k = this.key(key);
      return this.send(k, (e) => c.bfMexistsArgs(e, k, items), c.parseBooleans);
    },
    info: (key: string): Promise<FilterInfo | null> => {
      const k = this.key(key);
      return this.send(k, (e) => c.bfInfoArgs(e, k), c.parseFilterInfo);
    },
  };

  // The batch commands: split by slot in a cluster and in chunks of at most
  // 10000 keys; on the Functions edition, one single call per key.

  mclaim(
    keys: string[],
    lease: number,
    options: { payloads?: Bytes[]; maxTries?: number; bloom?: string } = {},
  ): Promise<BatchItem<ClaimReply>[]> {
    return new BatchRunner(this).mclaim(keys, lease, options);
  }

  mdone(items: { key: string; token: string; result?: Bytes }[], options: { retain?: number; bloom?: string } = {}): Promise<BatchItem<DoneReply>[]> {
    return new BatchRunner(this).mdone(items, options);
  }

  mrelease(items: { key: string; token: string }[]): Promise<BatchItem<boolean>[]> {
    return new BatchRunner(this).mrelease(items);
  }

  /** process() for many keys at once over MCLAIM / MDONE / MRELEASE. */
  processBatch<T>(entries: BatchEntry[], fn: (ctx: ProcessContext) => T | Promise<T>, options: BatchOptions<T> = {}): Promise<BatchOutcome<T>[]> {
    return new BatchRunner(this).process(entries, fn, options);
  }

  /** Calls a hook; a hook's own error never breaks the loop. */
  hook<K extends keyof Hooks>(name: K, info: Parameters<NonNullable<Hooks[K]>>[0]): void {
    try {
      (this.hooks[name] as ((i: typeof info) => void) | undefined)?.(info);
    } catch {
      // ignored
    }
  }

  /** The result to store for `value`, after the size policy. */
  async serializeResult(key: string, stored: string | Buffer): Promise<Bytes | undefined> {
    const max = await this.maxResult();
    const size = Buffer.byteLength(stored);
    if (size <= max) return stored;
    this.stats.oversize++;
    this.hook('onOversize', { key, bytes: size, maxResult: max });
    const policy = this.options.oversize ?? 'omit';
    if (policy === 'omit') return undefined;
    const smaller = policy(Buffer.isBuffer(stored) ? stored : Buffer.from(stored), max, key);
    return smaller !== undefined && Buffer.byteLength(smaller) <= max ? smaller : undefined;
  }

  /**
   * The consumer loop in one call: claims `key`; on NEW / SEEN / RETRY runs
   * `fn` (keeping the lease alive with EXTEND while it runs), then DONE with
   * its serialised result, or RELEASE when it throws (and rethrows); on DONE
   * replays the stored result without running `fn`; on BUSY waits for the
   * copy in flight (WAIT on the module, polling with backoff on the
   * Functions edition) up to `waitMs`, then throws BusyError. Throws
   * MismatchError, ExhaustedError, and LeaseLostError when another worker
   * took the key over (its DONE is refused).
   */
  async process<T>(key: string, fn: (ctx: ProcessContext) => T | Promise<T>, options: ProcessOptions<T> = {}): Promise<Outcome<T>> {
    const edition = await this.edition();
    const lease = options.lease ?? this.options.lease ?? 30;
    const waitMs = options.waitMs ?? this.options.waitMs ?? 5000;
    const serializer = (options.serializer ?? this.serializer) as Serializer<T>;
    const claimOptions = { payload: options.payload, maxTries: options.maxTries, bloom: options.bloom };
    const deadline = Date.now() + waitMs;
    let backoff = 25;
    let waited = false;
    let reply: ClaimReply;
    for (;;) {
      const left = Math.ceil(deadline - Date.now());
      // The first claim does not wait, so that a BUSY is seen (and `waited`
      // known); the ones after it wait on the server where the module runs.
      const wait = waited && edition === 'module' && left > 0 ? Math.min(left, MAX_WAIT_MS) : undefined;
      reply = await this.claim(key, lease, { ...claimOptions, wait });
      if (reply.status !== 'BUSY') break;
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        this.stats.busy++;
        this.hook('onBusy', { key, attempt: reply.attempt, leaseMs: reply.leaseMs });
        throw new BusyError(key, reply.attempt, reply.leaseMs);
      }
      waited = true;
      if (edition === 'functions') {
        // No WAIT there: poll, doubling up to a second, never past the holder's lease end or our deadline.
        await sleep(Math.max(1, Math.min(backoff, remaining, reply.leaseMs)));
        backoff = Math.min(backoff * 2, 1000);
      }
    }
    switch (reply.status) {
      case 'DONE': {
        this.stats.replays++;
        const resultStored = reply.result !== null;
        this.hook('onReplay', { key, attempt: reply.attempt, resultStored, waited });
        const value = reply.result === null ? undefined : serializer.deserialize(reply.result);
        return { replayed: true, value, attempt: reply.attempt, status: 'DONE', resultStored, waited };
      }
      case 'MISMATCH':
        this.stats.mismatches++;
        throw new MismatchError(key, reply.attempt);
      case 'EXHAUSTED':
        this.stats.exhausted++;
        throw new ExhaustedError(key, reply.attempt);
    }
    return this.#run(key, reply, fn, { ...options, lease }, serializer, waited);
  }

  async #run<T>(
    key: string,
    claim: { status: GrantedStatus; token: string; attempt: number },
    fn: (ctx: ProcessContext) => T | Promise<T>,
    options: ProcessOptions<T> & { lease: number },
    serializer: Serializer<T>,
    waited: boolean,
  ): Promise<Outcome<T>> {
    const { token, attempt, status } = claim;
    const started = Date.now();
    const heartbeat = new Heartbeat(this, options.heartbeat === false ? 0 : (options.heartbeat ?? (options.lease * 1000) / 3));
    const lost = () => {
      this.stats.leaseLost++;
      this.hook('onLeaseLost', { key, attempt });
    };
    heartbeat.add(key, token, options.lease, () => new LeaseLostError(key, attempt));
    const signal = heartbeat.signal(key);
    let value: T;
    try {
      value = await fn({ key, attempt, status, token, signal });
    } catch (err) {
      await heartbeat.stop();
      if (signal.aborted) {
        lost();
        throw new LeaseLostError(key, attempt, { cause: err });
      }
      try {
        await this.release(key, token); // a waiting duplicate retries at once
      } catch {
        // the lease lapses by itself: the next claim answers RETRY all the same
      }
      this.stats.released++;
      this.hook('onRelease', { key, attempt, error: err });
      throw err;
    }
    await heartbeat.stop();
    if (signal.aborted) {
      lost();
      throw signal.reason;
    }
    let result = await this.serializeResult(key, serializer.serialize(value));
    let done: DoneReply;
    try {
      done = await this.done(key, token, { result, retain: options.retain, bloom: options.bloom });
    } catch (err) {
      if (err instanceof StaleError) {
        lost();
        throw new LeaseLostError(key, attempt, { cause: err });
      }
      if (!(err instanceof ResultTooLargeError)) throw err;
      // The server's limit is lower than we knew (or a proto-max-bulk-len
      // bound): complete all the same, without the result.
      this.stats.oversize++;
      result = undefined;
      done = await this.done(key, token, { retain: options.retain, bloom: options.bloom });
    }
    if (done.alreadyDone) {
      // Another worker claimed the key after our lease lapsed and completed
      // it: its result stands, ours is not stored.
      lost();
      throw new LeaseLostError(key, attempt);
    }
    if (done.resultDropped) this.stats.resultsDropped++;
    const resultStored = done.completed && result !== undefined && !done.resultDropped;
    this.stats.firstRuns++;
    this.hook('onFirstRun', { key, attempt, status, durationMs: Date.now() - started, resultStored });
    return { replayed: false, value, attempt, status, resultStored, waited, done };
  }

  /**
   * `fn` wrapped in process(): the returned function claims `key(...args)`,
   * runs `fn(ctx, ...args)` once however often it is called, and resolves
   * with its value (replayed on later calls). A replay of a record that kept
   * no result (oversize) rejects with ResultNotStoredError.
   */
  wrap<A extends unknown[], T>(
    fn: (ctx: ProcessContext, ...args: A) => T | Promise<T>,
    options: ProcessOptions<T> & { key: (...args: A) => string; payload?: (...args: A) => Bytes },
  ): (...args: A) => Promise<T> {
    return async (...args: A) => {
      const { key, payload, ...rest } = options;
      const k = key(...args);
      const outcome = await this.process(k, (ctx) => fn(ctx, ...args), { ...rest, payload: payload?.(...args) });
      if (outcome.replayed && !outcome.resultStored) throw new ResultNotStoredError(k);
      return outcome.value as T;
    };
  }
}

/**
 * Keeps leases alive while work runs: every `intervalMs`, one EXTEND per
 * held key (concurrently). A STALE answer means another worker claimed the
 * key: its signal is aborted. A connection error is retried at the next beat.
 */
export class Heartbeat {
  #held = new Map<string, { token: string; lease: number; controller: AbortController; lost: () => Error }>();
  #timer?: ReturnType<typeof setInterval>;
  #beat?: Promise<unknown>;

  constructor(
    private readonly idem: Idem,
    intervalMs: number,
  ) {
    if (intervalMs > 0) {
      this.#timer = setInterval(() => {
        this.#beat ??= this.#extendAll().finally(() => (this.#beat = undefined));
      }, intervalMs);
      this.#timer.unref?.();
    }
  }

  add(key: string, token: string, lease: number, lost: () => Error): void {
    this.#held.set(key, { token, lease, controller: new AbortController(), lost });
  }

  signal(key: string): AbortSignal {
    return this.#held.get(key)!.controller.signal;
  }

  delete(key: string): void {
    this.#held.delete(key);
  }

  async #extendAll(): Promise<void> {
    await Promise.all(
      [...this.#held].map(async ([key, held]) => {
        if (held.controller.signal.aborted) return;
        try {
          await this.idem.extend(key, held.token, held.lease);
          this.idem.stats.extends++;
        } catch (err) {
          if (err instanceof StaleError) held.controller.abort(held.lost());
        }
      }),
    );
  }

  /** Stops the timer and waits for an EXTEND in flight. */
  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    await this.#beat;
  }
}

/** `new Idem(client, options)`. */
export function createIdem(client: Client, options?: IdemOptions): Idem {
  return new Idem(client, options);
}
