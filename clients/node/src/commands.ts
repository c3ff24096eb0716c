// Each command's arguments (for both editions) and its reply decoded into the
// types of types.ts. Pure functions: the Idem class and the node-redis module
// share them. Every duration is given in ms; the ones the server takes in
// seconds (a lease, RETAIN, a filter's shard) must be whole seconds.
import { ModuleRequiredError, replyError } from './errors.js';
import { type Arg, bytes, entries, int, text } from './transport.js';
import type {
  BatchReply,
  ClaimOptions,
  ClaimReply,
  DoneOptions,
  DoneReply,
  Edition,
  FilterInfo,
  RecordInfo,
  ReserveOptions,
  ScanOptions,
} from './types.js';

function moduleOnly(what: string): never {
  throw new ModuleRequiredError(
    `${what} needs the redis-idem module: this server runs the Functions edition (functions/idem.lua), which cannot do it`,
  );
}

/** `ms` as the whole seconds the server takes; refused before anything is sent otherwise. */
export function seconds(ms: number, what: string): number {
  if (!Number.isInteger(ms) || ms < 1000 || ms % 1000 !== 0) {
    throw new RangeError(`${what} is in ms and must be whole seconds of at least 1000 (got ${ms})`);
  }
  return ms / 1000;
}

/** `FCALL fn 1 key` for the Functions edition, the module command otherwise: the arguments follow. */
function head(edition: Edition, moduleName: string, fn: string, key: Arg, readOnly = false): Arg[] {
  return edition === 'functions' ? [readOnly ? 'FCALL_RO' : 'FCALL', fn, 1, key] : [moduleName, key];
}

/** `FCALL fn 1 key ...` for the Functions edition, the module command otherwise. */
function command(edition: Edition, moduleName: string, fn: string, key: Arg, rest: Arg[], readOnly = false): Arg[] {
  const args = head(edition, moduleName, fn, key, readOnly);
  for (const arg of rest) args.push(arg);
  return args;
}

export function claimArgs(edition: Edition, key: Arg, lease: number, options: ClaimOptions = {}): Arg[] {
  const rest = head(edition, 'IDEM.CLAIM', 'idem_claim', key);
  rest.push(seconds(lease, 'lease'));
  if (options.payload !== undefined) rest.push('PAYLOAD', options.payload);
  if (options.maxTries !== undefined) rest.push('MAXTRIES', options.maxTries);
  if (options.bloom !== undefined) {
    if (edition === 'functions') moduleOnly('BLOOM');
    rest.push('BLOOM', options.bloom);
  }
  if (options.owner !== undefined) rest.push('OWNER', options.owner);
  if (options.wait !== undefined && (!Number.isInteger(options.wait) || options.wait < 0)) {
    throw new RangeError(`wait is in ms and must be a whole number >= 0 (got ${options.wait})`);
  }
  if (options.wait) {
    if (edition === 'functions') moduleOnly('WAIT (a function cannot block; retry a BUSY claim after a backoff)');
    rest.push('WAIT', options.wait);
  }
  return rest;
}

export function parseClaim(reply: unknown): ClaimReply {
  if (!Array.isArray(reply) || reply.length !== 3) throw new TypeError('IDEM.CLAIM: expected a 3-element array');
  const status = text(reply[0]);
  const attempt = int(reply[2]);
  switch (status) {
    case 'NEW':
    case 'SEEN':
    case 'RETRY':
      return { status, token: text(reply[1]), attempt };
    case 'DONE':
      return { status, result: bytes(reply[1]), attempt };
    case 'BUSY':
      return { status, leaseLeft: int(reply[1]), attempt };
    case 'MISMATCH':
    case 'EXHAUSTED':
      return { status, attempt };
    default:
      throw new TypeError(`IDEM.CLAIM: unknown status ${status}`);
  }
}

export function doneArgs(edition: Edition, key: Arg, token: string, options: DoneOptions = {}): Arg[] {
  const rest = head(edition, 'IDEM.DONE', 'idem_done', key);
  rest.push(token);
  if (options.result !== undefined) rest.push('RESULT', options.result);
  if (options.retain !== undefined) rest.push('RETAIN', seconds(options.retain, 'retain'));
  if (options.bloom !== undefined) {
    if (edition === 'functions') moduleOnly('BLOOM');
    rest.push('BLOOM', options.bloom);
  }
  return rest;
}

const doneReply = (code: DoneReply['code']): DoneReply =>
  Object.freeze({ code, completed: (code & 1) === 1, alreadyDone: code === 0, resultDropped: (code & 2) === 2, bloomDropped: (code & 4) === 4 });
/** The five answers DONE can give, made once. */
const DONE_REPLIES: Record<number, DoneReply> = { 0: doneReply(0), 1: doneReply(1), 3: doneReply(3), 5: doneReply(5), 7: doneReply(7) };

export function parseDone(reply: unknown): DoneReply {
  const code = int(reply);
  const parsed = DONE_REPLIES[code];
  if (parsed === undefined) throw new TypeError(`IDEM.DONE: unexpected reply ${code}`);
  return parsed;
}

export const releaseArgs = (edition: Edition, key: Arg, token: string): Arg[] =>
  command(edition, 'IDEM.RELEASE', 'idem_release', key, [token]);
export const extendArgs = (edition: Edition, key: Arg, token: string, lease: number): Arg[] =>
  command(edition, 'IDEM.EXTEND', 'idem_extend', key, [token, seconds(lease, 'lease')]);
export const getArgs = (edition: Edition, key: Arg): Arg[] => command(edition, 'IDEM.GET', 'idem_get', key, [], true);
export const onceArgs = (edition: Edition, key: Arg, retain: number): Arg[] =>
  command(edition, 'IDEM.ONCE', 'idem_once', key, [seconds(retain, 'retain')]);

/** 1/0 replies (RELEASE, ONCE, BF.ADD, BF.EXISTS) as booleans. */
export const parseBoolean = (reply: unknown): boolean => int(reply) === 1;

/** EXTEND answers 1 or a STALE error: nothing to decode. */
export function parseExtend(reply: unknown): void {
  if (int(reply) !== 1) throw new TypeError(`IDEM.EXTEND: unexpected reply ${text(reply)}`);
}

export function parseGet(reply: unknown): RecordInfo | null {
  if (reply === null || reply === undefined) return null;
  const fields = new Map(entries(reply));
  const opt = (name: string) => {
    const v = fields.get(name);
    return v === null || v === undefined ? null : v;
  };
  const fingerprint = opt('fingerprint');
  const owner = opt('owner');
  return {
    state: text(fields.get('state')) as RecordInfo['state'],
    attempt: int(fields.get('attempt')),
    leaseMs: int(fields.get('lease_ms')),
    pttl: int(fields.get('pttl')),
    claimedAt: int(fields.get('claimed_at')),
    doneAt: int(fields.get('done_at')),
    result: bytes(opt('result')),
    fingerprint: fingerprint === null ? null : text(fingerprint),
    tries: opt('tries') === null ? null : int(fields.get('tries')),
    owner: owner === null ? null : text(owner),
  };
}

export const requeueArgs = (edition: Edition, key: Arg): Arg[] => command(edition, 'IDEM.REQUEUE', 'idem_requeue', key, []);

/** One step of IDEM.SCAN (FCALL_RO idem_scan 0 ..., which takes no key); `match` is the stored keys' glob. */
export function scanArgs(edition: Edition, cursor: string, o: ScanOptions = {}): Arg[] {
  const rest: Arg[] = [cursor];
  if (o.match !== undefined) rest.push('MATCH', o.match);
  if (o.count !== undefined) rest.push('COUNT', o.count);
  if (o.state !== undefined) rest.push('STATE', o.state);
  if (o.minTries !== undefined) rest.push('MINTRIES', o.minTries);
  if (o.idle !== undefined) rest.push('IDLE', seconds(o.idle, 'idle'));
  return edition === 'functions' ? ['FCALL_RO', 'idem_scan', 0, ...rest] : ['IDEM.SCAN', ...rest];
}

/** `[next-cursor, [key, ...]]`. */
export function parseScan(reply: unknown): { cursor: string; keys: string[] } {
  if (!Array.isArray(reply) || reply.length !== 2 || !Array.isArray(reply[1])) throw new TypeError('IDEM.SCAN: expected [cursor, keys]');
  return { cursor: text(reply[0]), keys: reply[1].map(text) };
}

// The filters: module only.
function filter(edition: Edition, args: Arg[]): Arg[] {
  if (edition === 'functions') moduleOnly(`${args[0]} (the Functions edition keeps no Bloom filters)`);
  return args;
}
export function reserveArgs(edition: Edition, key: Arg, errorRate: number, capacity: number, o: ReserveOptions = {}): Arg[] {
  const args: Arg[] = ['IDEM.BF.RESERVE', key, errorRate, capacity];
  if (o.window !== undefined) args.push('WINDOW', o.window);
  if (o.shard !== undefined) args.push('SHARD', typeof o.shard === 'number' ? seconds(o.shard, 'shard') : o.shard);
  if (o.expansion !== undefined) args.push('EXPANSION', o.expansion);
  return filter(edition, args);
}
export const bfAddArgs = (e: Edition, key: Arg, item: Arg) => filter(e, ['IDEM.BF.ADD', key, item]);
export const bfMaddArgs = (e: Edition, key: Arg, items: Arg[]) => filter(e, ['IDEM.BF.MADD', key, ...items]);
export const bfExistsArgs = (e: Edition, key: Arg, item: Arg) => filter(e, ['IDEM.BF.EXISTS', key, item]);
export const bfMexistsArgs = (e: Edition, key: Arg, items: Arg[]) => filter(e, ['IDEM.BF.MEXISTS', key, ...items]);
export const bfInfoArgs = (e: Edition, key: Arg) => filter(e, ['IDEM.BF.INFO', key]);
export const parseBooleans = (reply: unknown): boolean[] => (reply as unknown[]).map(parseBoolean);

export function parseFilterInfo(reply: unknown): FilterInfo | null {
  if (reply === null || reply === undefined) return null;
  const f = new Map(entries(reply));
  const num = (name: string) => Number(text(f.get(name)));
  return {
    errorRate: num('error_rate'),
    capacity: num('capacity'),
    window: num('window'),
    shard: num('shard') * 1000,
    expansion: num('expansion'),
    items: num('items'),
    bytes: num('bytes'),
    shards: ((f.get('shards') as unknown[]) ?? []).map((shard) => {
      const s = new Map(entries(shard));
      return { start: int(s.get('start')), items: int(s.get('items')), filters: int(s.get('filters')), bytes: int(s.get('bytes')) };
    }),
  };
}

// The batch commands (module only; the *Many helpers send single calls on the Functions edition).
export function mclaimArgs(keys: Arg[], lease: number, o: { payloads?: Arg[]; maxTries?: number; bloom?: string; owner?: string } = {}): Arg[] {
  const args: Arg[] = ['IDEM.MCLAIM', seconds(lease, 'lease'), keys.length, ...keys];
  if (o.payloads !== undefined) args.push('PAYLOADS', ...o.payloads);
  if (o.maxTries !== undefined) args.push('MAXTRIES', o.maxTries);
  if (o.bloom !== undefined) args.push('BLOOM', o.bloom);
  if (o.owner !== undefined) args.push('OWNER', o.owner);
  return args;
}
export function mdoneArgs(items: { key: Arg; token: string; result?: Arg }[], o: { retain?: number; bloom?: string } = {}): Arg[] {
  const args: Arg[] = ['IDEM.MDONE', items.length];
  for (const item of items) args.push(item.key, item.token);
  // RESULTS takes one per key or none (doneMany sends the keys with and without a result apart).
  const withResult = items.filter((item) => item.result !== undefined).length;
  if (withResult !== 0 && withResult !== items.length) throw new TypeError('IDEM.MDONE: give a result for every key or for none');
  if (withResult) args.push('RESULTS', ...items.map((item) => item.result as Arg));
  if (o.retain !== undefined) args.push('RETAIN', seconds(o.retain, 'retain'));
  if (o.bloom !== undefined) args.push('BLOOM', o.bloom);
  return args;
}
export function mreleaseArgs(items: { key: Arg; token: string }[]): Arg[] {
  const args: Arg[] = ['IDEM.MRELEASE', items.length];
  for (const item of items) args.push(item.key, item.token);
  return args;
}

/** A batch reply's elements, each decoded, or the typed error of its error element. */
export function parseBatch<T>(reply: unknown, parse: (element: unknown) => T): BatchReply<T>[] {
  if (!Array.isArray(reply)) throw new TypeError('expected an array reply');
  return reply.map((element) => (element instanceof Error ? replyError(element) : parse(element)));
}
