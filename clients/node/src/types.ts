// The typed replies of every command (docs/commands.md).

/** A key, token, payload or result as sent to the server. */
export type Bytes = string | Buffer;

/** IDEM.CLAIM's statuses. */
export const ClaimStatus = {
  NEW: 'NEW',
  SEEN: 'SEEN',
  RETRY: 'RETRY',
  DONE: 'DONE',
  BUSY: 'BUSY',
  MISMATCH: 'MISMATCH',
  EXHAUSTED: 'EXHAUSTED',
} as const;
export type ClaimStatus = (typeof ClaimStatus)[keyof typeof ClaimStatus];

/** The statuses that grant the claim: run the work, then DONE or RELEASE. */
export type GrantedStatus = 'NEW' | 'SEEN' | 'RETRY';

/** IDEM.CLAIM's reply, by status (`leaseLeft`: ms left on the holder's lease). */
export type ClaimReply =
  | { status: GrantedStatus; token: string; attempt: number }
  | { status: 'DONE'; result: Buffer | null; attempt: number }
  | { status: 'BUSY'; leaseLeft: number; attempt: number }
  | { status: 'MISMATCH' | 'EXHAUSTED'; attempt: number };

/** IDEM.DONE's reply decoded: 0 already done; 1, 3, 5, 7 completed by this call, with what was dropped. */
export interface DoneReply {
  /** the integer the server answered */
  code: 0 | 1 | 3 | 5 | 7;
  /** this call completed the record (an odd reply) */
  completed: boolean;
  /** 0: the record was already done; nothing changed */
  alreadyDone: boolean;
  /** 3 or 7: the RESULT was not stored (used memory over maxmemory) */
  resultDropped: boolean;
  /** 5 or 7: the BLOOM add was not made */
  bloomDropped: boolean;
}

export type RecordState = 'processing' | 'expired' | 'released' | 'done';

/** IDEM.GET's record. Times are ms (`leaseMs`: the lease left); `claimedAt`/`doneAt` Unix ms (0: never). */
export interface RecordInfo {
  state: RecordState;
  attempt: number;
  leaseMs: number;
  pttl: number;
  claimedAt: number;
  doneAt: number;
  result: Buffer | null;
  fingerprint: string | null;
  /** claims since the latest requeue (what maxTries counts); null from a module older than IDEM.REQUEUE */
  tries: number | null;
  /** the latest claim's OWNER while processing, released or expired; null when it has none (and from a server older than OWNER) */
  owner: string | null;
}

/** scan()'s filters: a record is listed when it matches every one given. */
export interface ScanOptions {
  /** its state now */
  state?: RecordState;
  /** its tries (claims since the latest requeue) are at least this: with state 'released' or 'expired', a consumer's dead letters for maxTries */
  minTries?: number;
  /** ms since its latest change (claim, extension, release, completion), sent as whole seconds (>= 1000) */
  idle?: number;
  /** a SCAN glob on the key, under the instance's prefix */
  match?: string;
  /** SCAN's hint of work per call */
  count?: number;
}

/** IDEM.BF.INFO's reply. */
export interface FilterInfo {
  errorRate: number;
  capacity: number;
  window: number;
  /** shard period, ms */
  shard: number;
  expansion: number;
  items: number;
  bytes: number;
  shards: { start: number; items: number; filters: number; bytes: number }[];
}

export interface ClaimOptions {
  /** PAYLOAD: its fingerprint is kept; a claim with another payload answers MISMATCH */
  payload?: Bytes;
  /** MAXTRIES n */
  maxTries?: number;
  /** BLOOM filterkey (module only); prefixed like the record's key */
  bloom?: string;
  /** WAIT ms (module only; 0 = no wait) */
  wait?: number;
  /** OWNER: who holds the claim (1 to 64 bytes), shown by get() while it is held */
  owner?: string;
}

export interface DoneOptions {
  result?: Bytes;
  /** RETAIN, ms (whole seconds) */
  retain?: number;
  /** BLOOM filterkey (module only) */
  bloom?: string;
}

export interface ReserveOptions {
  /** how many shards are kept */
  window?: number;
  /** the shard period: DAY, HOUR, or ms (whole seconds) */
  shard?: 'DAY' | 'HOUR' | number;
  expansion?: number;
}

/** Which edition answers on the server. */
export type Edition = 'module' | 'functions';

/** One element of a batch command's reply (claimMany, doneMany, releaseMany): the single command's answer, or its per-key error. */
export type BatchReply<T> = T | Error;

/**
 * `durable`: each claim that grants work and each DONE is followed, on the
 * same connection in the same round trip, by `WAIT replicas timeout` (or,
 * with `fsync`, `WAITAOF 1 replicas timeout`); fewer acknowledgements than
 * `replicas` is NotDurableError.
 */
export interface Durable {
  /** replicas that must acknowledge (>= 0) */
  replicas: number;
  /** ms one WAIT / WAITAOF may block (1000) */
  timeout?: number;
  /** WAITAOF: the primary's fsync too, and each replica's (Redis 7.2+, Valkey 8+, appendonly yes) */
  fsync?: boolean;
}
