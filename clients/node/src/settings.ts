// The instance's settings and their defaults (docs/clients.md, "Defaults"),
// checked and resolved once, when the Idem is made; a call's own options
// are merged only when it gives some. Every duration is in ms.
import { hostname } from 'node:os';
import { type Codec, json } from './codec.js';
import { seconds } from './commands.js';
import type { Hooks } from './core.js';
import type { Bytes, Durable, Edition } from './types.js';

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
  /** DONE sent again after a connection error (5): at most 1 + doneRetries DONEs per call */
  doneRetries?: number;
  /** ms one DONE (and its WAIT with durable), or the RELEASE of a failed work, may take before its reply counts as lost (5000) */
  doneTimeout?: number;
  /** OWNER sent with every claim, shown by get() while the claim is held (host:pid) */
  owner?: string;
  /** WAIT (or WAITAOF) after each claim that grants work and each DONE (off) */
  durable?: Durable;
  /** concurrent process() calls share one IDEM.MCLAIM / IDEM.MDONE per tick (true) */
  batch?: boolean;
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

/** `durable` with its defaults filled in. */
export interface DurableSettings {
  replicas: number;
  timeout: number;
  fsync: boolean;
}

/** What one call runs with. */
export interface Settings {
  lease: number;
  wait: number;
  heartbeat: number;
  /** the heartbeat was set (else it follows the lease: lease / 3) */
  heartbeatSet: boolean;
  maxTries: number | undefined;
  retain: number | undefined;
  /** the filter's key as the server sees it (prefixed) */
  bloom: string | undefined;
  codec: Codec;
  oversize: 'complete' | 'error';
  doneRetries: number;
  doneTimeout: number;
  owner: string;
  durable: DurableSettings | undefined;
  batch: boolean;
}

/** host:pid, as docs/clients.md defines the default owner (a Node process never forks in place: the pid is its own). */
export const defaultOwner = (): string => `${hostname()}:${process.pid}`;

function nonNegative(ms: number, what: string): number {
  if (typeof ms !== 'number' || !(ms >= 0) || !Number.isFinite(ms)) throw new RangeError(`${what} is in ms and must be >= 0 (got ${ms})`);
  return ms;
}

function wholeAtLeast(n: number, min: number, what: string): number {
  if (!Number.isInteger(n) || n < min) throw new RangeError(`${what} must be a whole number >= ${min} (got ${n})`);
  return n;
}

function durableSettings(d: Durable | undefined): DurableSettings | undefined {
  if (d === undefined || d === null) return undefined;
  const timeout = d.timeout ?? 1000;
  if (typeof timeout !== 'number' || !(timeout > 0) || !Number.isFinite(timeout)) throw new RangeError(`durable.timeout is in ms and must be > 0 (got ${timeout})`);
  return { replicas: wholeAtLeast(d.replicas, 0, 'durable.replicas'), timeout: Math.ceil(timeout), fsync: !!d.fsync };
}

/** The instance's settings, checked once. */
export function instanceSettings(o: IdemOptions): Settings {
  const lease = o.lease ?? 30000;
  seconds(lease, 'lease');
  if (o.retain !== undefined) seconds(o.retain, 'retain');
  const oversize = o.oversize ?? 'complete';
  if (oversize !== 'complete' && oversize !== 'error') throw new RangeError(`oversize is 'complete' or 'error' (got ${String(oversize)})`);
  const owner = o.owner ?? defaultOwner();
  const ownerBytes = Buffer.byteLength(owner);
  if (typeof owner !== 'string' || ownerBytes < 1 || ownerBytes > 64) throw new RangeError(`owner is 1 to 64 bytes (got ${ownerBytes})`);
  if (o.maxTries !== undefined) wholeAtLeast(o.maxTries, 1, 'maxTries');
  return {
    lease,
    wait: Math.ceil(nonNegative(o.wait ?? 10000, 'wait')),
    heartbeat: nonNegative(o.heartbeat ?? lease / 3, 'heartbeat'),
    heartbeatSet: o.heartbeat !== undefined,
    maxTries: o.maxTries,
    retain: o.retain,
    bloom: undefined,
    codec: o.codec ?? json,
    oversize,
    doneRetries: wholeAtLeast(o.doneRetries ?? 5, 0, 'doneRetries'),
    doneTimeout: Math.ceil(nonNegative(o.doneTimeout ?? 5000, 'doneTimeout')) || 5000,
    owner,
    durable: durableSettings(o.durable),
    batch: o.batch ?? true,
  };
}

/** A call's settings: the instance's, or a copy with the call's own options, checked. */
export function callSettings(base: Settings, call: ProcessOptions | undefined, prefix: string): Settings {
  if (call === undefined) return base;
  const { lease, wait, heartbeat, maxTries, retain, bloom, codec } = call;
  if (lease === undefined && wait === undefined && heartbeat === undefined && maxTries === undefined && retain === undefined && bloom === undefined && codec === undefined) {
    return base;
  }
  const s = { ...base };
  if (lease !== undefined) {
    seconds(lease, 'lease');
    s.lease = lease;
    if (!base.heartbeatSet) s.heartbeat = lease / 3;
  }
  if (heartbeat !== undefined) s.heartbeat = nonNegative(heartbeat, 'heartbeat');
  if (wait !== undefined) s.wait = Math.ceil(nonNegative(wait, 'wait'));
  if (maxTries !== undefined) s.maxTries = wholeAtLeast(maxTries, 1, 'maxTries');
  if (retain !== undefined) s.retain = seconds(retain, 'retain') * 1000;
  if (bloom !== undefined) s.bloom = prefix + bloom;
  if (codec !== undefined) s.codec = codec as Codec;
  return s;
}
