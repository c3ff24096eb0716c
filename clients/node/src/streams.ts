// redis-idem/streams: a Redis Streams consumer over a group, each entry run
// through the Idem's loop (docs/clients.md, "Consumers of brokers"), on the
// Idem's own client (ioredis or node-redis):
// - XREADGROUP for new entries, XAUTOCLAIM for entries idle past
//   `claimIdle` (a crashed consumer's, and those held back);
// - the entry's XACK written right after its DONE on the same connection
//   (one round trip, before durable's WAIT, so that WAIT covers both);
// - Busy and failures left pending, their idle time set so that XAUTOCLAIM
//   brings them back after the holder's lease left or the retry delay;
// - dead letters (Exhausted, Mismatch, no key) added to `<stream>:dlq` and
//   acknowledged in one script (atomic, as MULTI, and only while the entry
//   is still this consumer's: one that another consumer took over is its);
// - the entries in hand kept this consumer's (their idle time reset) every
//   claimIdle / 3, so that no other consumer takes over one still at work.
import type { Job } from './core.js';
import type { Idem } from './idem.js';
import type { Ride } from './connection.js';
import { type AdapterStats, type MessageOptions, MessageLoop, errorText, MIN_DELAY, MAX_RETRY_DELAY, DEFAULT_RETRY_DELAY } from './broker.js';
import { BusyError } from './errors.js';
import { type Arg, bytes, entries, text } from './transport.js';

/** The field the default key function reads. */
export const KEY_FIELD = 'idem-key';

/** One entry of the stream. */
export interface StreamEntry {
  id: string;
  /** its fields as UTF-8 text (the last value of a field given twice) */
  fields: Record<string, string>;
  /** its fields as they are, in order */
  raw: [Buffer, Buffer][];
}

export type StreamHandler<T> = (entry: StreamEntry, job: Job) => T | Promise<T>;

export interface StreamConsumerOptions<T> extends MessageOptions<StreamEntry, T> {
  stream: string;
  group: string;
  /** this consumer's name in the group (unique per process) */
  consumer: string;
  /** entries handled at once (8) */
  concurrency?: number;
  /** ms an entry must be idle before XAUTOCLAIM takes it over (the Idem's lease) */
  claimIdle?: number;
  /** ms one XREADGROUP blocks waiting for new entries (min(claimIdle / 2, 1000)) */
  block?: number;
  /** the dead-letter stream (`<stream>:dlq`) */
  deadLetterStream?: string;
  /** XGROUP CREATE the group when it does not exist, from the stream's first entry (0; MKSTREAM) (false) */
  createGroup?: boolean;
}

// Each script acts on an entry only while it is pending for this consumer
// (XPENDING's owner): an entry another consumer took over is left to it.
const MINE = `local function mine(id)
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], id, id, 1)
  return p[1] ~= nil and p[1][2] == ARGV[2]
end
`;
/** ARGV: group, consumer, id. 1: acknowledged. */
const ACK = `${MINE}if not mine(ARGV[3]) then return 0 end
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])`;
/**
 * ARGV: group, consumer, claimIdle, delay, base, ids... The entries this
 * consumer holds get an idle time of claimIdle - delay (XAUTOCLAIM takes them
 * after `delay`); a delay < 0 is a failure's: base doubling per delivery.
 */
const IDLE = `${MINE}local held = {}
for i = 6, #ARGV do if mine(ARGV[i]) then held[#held + 1] = ARGV[i] end end
if #held == 0 then return 0 end
local claimIdle, delay = tonumber(ARGV[3]), tonumber(ARGV[4])
if delay < 0 then
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], held[1], held[1], 1)
  delay = math.min(${MAX_RETRY_DELAY}, tonumber(ARGV[5]) * 2 ^ math.min(20, math.max(0, p[1][4] - 1)))
end
local idle = math.max(0, math.floor(claimIdle - delay))
redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, unpack(held), 'IDLE', idle, 'JUSTID')
return #held`;
/** KEYS: stream, dead-letter stream. ARGV: group, consumer, id, field, value, ... 1: moved. */
const DEAD_LETTER = `${MINE}if not mine(ARGV[3]) then return 0 end
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 4))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[3])
return 1`;

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms).unref?.());

export class StreamConsumer<T = unknown> {
  readonly #loop: MessageLoop<StreamEntry, T>;
  readonly #o: Required<Pick<StreamConsumerOptions<T>, 'stream' | 'group' | 'consumer' | 'concurrency' | 'claimIdle' | 'block' | 'deadLetterStream'>>;
  readonly #createGroup: boolean;
  readonly #retryDelay: number;
  readonly #inHand = new Map<string, Promise<void>>();
  #cursor = '0-0';
  #lastRound = 0;
  #stopping = false;
  #running: Promise<void> | undefined;
  #freed: (() => void) | undefined;
  #touch: ReturnType<typeof setInterval> | undefined;

  constructor(idem: Idem, options: StreamConsumerOptions<T>) {
    this.#loop = new MessageLoop(idem, options, (entry) => entry.fields[KEY_FIELD], `no ${KEY_FIELD} field`);
    const { stream, group, consumer } = options;
    for (const [name, value] of Object.entries({ stream, group, consumer })) {
      if (typeof value !== 'string' || value === '') throw new TypeError(`redis-idem/streams: ${name} is required`);
    }
    const claimIdle = options.claimIdle ?? options.process?.lease ?? this.#loop.rt.settings.lease;
    if (!(claimIdle >= 1)) throw new RangeError(`claimIdle is in ms and must be >= 1 (got ${claimIdle})`);
    this.#o = {
      stream,
      group,
      consumer,
      concurrency: Math.max(1, options.concurrency ?? 8),
      claimIdle,
      block: Math.max(1, Math.ceil(options.block ?? Math.min(claimIdle / 2, 1000))),
      deadLetterStream: options.deadLetterStream ?? `${stream}:dlq`,
    };
    this.#createGroup = options.createGroup ?? false;
    this.#retryDelay = options.retryDelay ?? DEFAULT_RETRY_DELAY;
  }

  /** The Idem's counters and the consumer's: entries acknowledged, held back (left pending), dead-lettered. */
  get stats(): AdapterStats {
    return this.#loop.stats;
  }

  /** Reads and handles entries until stop(); resolves once the entries in hand are settled. */
  run(handler: StreamHandler<T>): Promise<void> {
    if (this.#running) throw new Error('redis-idem/streams: run() is already running');
    this.#stopping = false;
    this.#running = this.#run(handler).finally(() => {
      clearInterval(this.#touch);
      this.#running = undefined;
    });
    return this.#running;
  }

  /** Takes no new entry; resolves when run() has ended (the entries in hand settled). */
  async stop(): Promise<void> {
    this.#stopping = true;
    this.#freed?.();
    await this.#running;
  }

  #send(args: Arg[]): Promise<unknown> {
    return this.#loop.rt.conn.transport.send(this.#o.stream, args);
  }

  #script(script: string, keys: string[], args: Arg[]): Arg[] {
    return ['EVAL', script, keys.length, ...keys, ...args];
  }

  async #run(handler: StreamHandler<T>): Promise<void> {
    const { stream, group, claimIdle } = this.#o;
    if (this.#createGroup) {
      await this.#send(['XGROUP', 'CREATE', stream, group, '0', 'MKSTREAM']).catch((err: unknown) => {
        if (!/BUSYGROUP/.test(errorText(err))) throw err;
      });
    }
    this.#touch = setInterval(() => void this.#keep(), Math.max(MIN_DELAY, claimIdle / 3));
    this.#touch.unref?.();
    while (!this.#stopping) {
      if (this.#inHand.size >= this.#o.concurrency) {
        await new Promise<void>((resolve) => (this.#freed = resolve));
        continue;
      }
      let read: StreamEntry[];
      try {
        read = await this.#read(this.#o.concurrency - this.#inHand.size);
      } catch (err) {
        this.#loop.report(err);
        await sleep(this.#o.block);
        continue;
      }
      for (const entry of read) {
        if (this.#inHand.has(entry.id)) continue;
        const handled = this.#handle(entry, handler).finally(() => {
          this.#inHand.delete(entry.id);
          this.#freed?.();
        });
        this.#inHand.set(entry.id, handled);
      }
    }
    await Promise.all(this.#inHand.values());
  }

  /** XAUTOCLAIM's next step while a round of the pending list is under way or due, else XREADGROUP. */
  async #read(count: number): Promise<StreamEntry[]> {
    const { stream, group, consumer, claimIdle, block } = this.#o;
    if (this.#cursor !== '0-0' || Date.now() - this.#lastRound >= Math.min(claimIdle / 4, 1000)) {
      const reply = (await this.#send(['XAUTOCLAIM', stream, group, consumer, Math.floor(claimIdle), this.#cursor, 'COUNT', count])) as unknown[];
      this.#cursor = text(reply[0]);
      if (this.#cursor === '0-0') this.#lastRound = Date.now();
      const claimed = parseEntries(reply[1]);
      if (claimed.length) return claimed;
    }
    const t = this.#loop.rt.conn.transport;
    const args: Arg[] = ['XREADGROUP', 'GROUP', group, consumer, 'COUNT', count, 'BLOCK', block, 'STREAMS', stream, '>'];
    const reply = await (t.sendBlocking ? t.sendBlocking(stream, args) : t.send(stream, ['XREADGROUP', 'GROUP', group, consumer, 'COUNT', count, 'STREAMS', stream, '>']));
    if (reply === null || reply === undefined) return [];
    return perStream(reply).flatMap((list) => parseEntries(list));
  }

  async #handle(entry: StreamEntry, handler: StreamHandler<T>): Promise<void> {
    const { stream, group, consumer } = this.#o;
    const loop = this.#loop;
    const ack = () => this.#script(ACK, [stream], [group, consumer, entry.id]);
    // With one server (not a cluster) the XACK rides with DONE: one round trip.
    const t = loop.rt.conn.transport;
    let replied = false;
    let acked = false;
    const ride: Ride | undefined =
      t.pipeline && !t.cluster
        ? {
            commands: [ack()],
            replied: ([reply]) => {
              replied = true;
              acked ||= Number(reply) === 1;
            },
          }
        : undefined;
    const { error } = await loop.run(entry, (job) => handler(entry, job), ride);
    const decision = loop.decide(error);
    try {
      if (decision.verdict === 'ack') {
        // a replay (no DONE), or a DONE without its XACK: acknowledged now
        if (!replied) acked = Number(await this.#send(ack())) === 1;
        if (acked) loop.count('ack'); // else another consumer took it over: it acknowledges it
        return;
      }
      if (acked) {
        // Its XACK rode with a DONE that did not complete the record (STALE,
        // an error) or was not acknowledged as durable: pending again, as it was.
        await this.#send(['XCLAIM', stream, group, consumer, 0, entry.id, 'FORCE', 'JUSTID']);
      }
      if (decision.verdict === 'dead-letter') {
        const fields: Arg[] = entry.raw.flat();
        fields.push('original-id', entry.id, 'error', errorText(decision.error));
        const moved = await this.#send(this.#script(DEAD_LETTER, [stream, this.#o.deadLetterStream], [group, consumer, entry.id, ...fields]));
        if (Number(moved) === 1) loop.count('dead-letter');
        return;
      }
      // Left pending, to come again after the holder's lease left or the retry delay.
      const delay = decision.error instanceof BusyError ? decision.delay : -1;
      await this.#send(this.#script(IDLE, [stream], [group, consumer, this.#o.claimIdle, delay, this.#retryDelay, entry.id]));
      loop.count('hold');
    } catch (err) {
      loop.report(err); // left pending: XAUTOCLAIM brings it back after claimIdle
    }
  }

  /** The entries in hand stay this consumer's (their idle time reset). */
  async #keep(): Promise<void> {
    if (this.#inHand.size === 0) return;
    const { stream, group, consumer, claimIdle } = this.#o;
    try {
      await this.#send(this.#script(IDLE, [stream], [group, consumer, claimIdle, claimIdle, 0, ...this.#inHand.keys()]));
    } catch (err) {
      this.#loop.report(err);
    }
  }
}

/** XREADGROUP's reply as each stream's entries: [[name, entries], ...] (RESP2), or a map of them (RESP3). */
function perStream(reply: unknown): unknown[] {
  if (Array.isArray(reply)) return reply.map((item) => (Array.isArray(item) ? item[1] : undefined));
  return entries(reply).map(([, list]) => list);
}

/** XREADGROUP's or XAUTOCLAIM's entries: [id, [field, value, ...]], a deleted one (nil fields) left out. */
function parseEntries(list: unknown): StreamEntry[] {
  if (!Array.isArray(list)) return [];
  const out: StreamEntry[] = [];
  for (const item of list) {
    if (!Array.isArray(item) || item[1] === null || item[1] === undefined) continue;
    const raw = pairs(item[1]);
    const fields: Record<string, string> = {};
    for (const [k, v] of raw) fields[k.toString('utf8')] = v.toString('utf8');
    out.push({ id: text(item[0]), fields, raw });
  }
  return out;
}

/** An entry's fields as [name, value] Buffers (a flat array; a map from a RESP3 client). */
function pairs(fields: unknown): [Buffer, Buffer][] {
  if (!Array.isArray(fields)) return entries(fields).map(([k, v]) => [Buffer.from(k), bytes(v) ?? Buffer.alloc(0)]);
  const out: [Buffer, Buffer][] = [];
  for (let i = 0; i + 1 < fields.length; i += 2) out.push([bytes(fields[i]) ?? Buffer.alloc(0), bytes(fields[i + 1]) ?? Buffer.alloc(0)]);
  return out;
}
