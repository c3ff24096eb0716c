// One batch per tick (docs/clients.md, "Concurrent calls"): with `batch`
// on, the first claims (without WAIT) and the DONEs of concurrent process()
// calls on one instance share batch commands. A call alone sends its own
// command at once; while a command is in flight, the calls that arrive
// queue, and go as one IDEM.MCLAIM (or IDEM.MDONE) when it returns: one
// queue per slot in a cluster, one call per compatible group (the same
// lease, MAXTRIES and BLOOM; PAYLOAD and RESULT for all or none). Each
// caller gets exactly its own answer (a per-key error element rejects that
// caller only) and WAIT's answer with `durable`. On the Functions edition,
// which has no batch commands, each call sends its own single command (the
// client pipelines concurrent ones): the same thing as a batch of singles.
import calculateSlot from 'cluster-key-slot';
import type { Ack, Claimed, Connection } from './connection.js';
import { chunk } from './core.js';
import type { Settings } from './settings.js';
import type { BatchReply, Bytes, DoneOptions, DoneReply } from './types.js';

interface Waiting<R> {
  key: string;
  s: Settings;
  resolve(value: R): void;
  reject(err: unknown): void;
}
interface ClaimWaiting extends Waiting<Claimed> {
  payload: Bytes | undefined;
}
interface DoneWaiting extends Waiting<{ reply: DoneReply; ack?: Ack }> {
  token: string;
  o: DoneOptions;
}

/** One slot's queue of one command kind. */
class Lane<W> {
  inFlight = 0;
  queued: W[] = [];
}

/** `items` grouped by `compat` (a text), in first-seen order. */
function groups<W>(items: W[], compat: (w: W) => string): W[][] {
  if (items.length === 1) return [items];
  const by = new Map<string, W[]>();
  for (const w of items) {
    const k = compat(w);
    const g = by.get(k);
    if (g) g.push(w);
    else by.set(k, [w]);
  }
  return [...by.values()];
}

/** Each caller's own answer from a batch reply: its element, or its error element. */
function answer<R, W extends Waiting<{ reply: R; ack?: Ack }>>(waiting: W[], replies: BatchReply<R>[], ack: Ack | undefined): void {
  waiting.forEach((w, i) => {
    const reply = replies[i];
    if (reply instanceof Error) w.reject(reply);
    else if (reply === undefined) w.reject(new TypeError('a batch reply with fewer elements than keys'));
    else w.resolve(ack === undefined ? { reply } : { reply, ack });
  });
}

const claimCompat = (w: ClaimWaiting) => `${w.s.lease}|${w.s.maxTries}|${w.s.bloom}|${w.payload === undefined}`;
const doneCompat = (w: DoneWaiting) => `${w.o.retain}|${w.o.bloom}|${w.o.result === undefined}`;

export class Coalescer {
  readonly #one = { claim: new Lane<ClaimWaiting>(), done: new Lane<DoneWaiting>() };
  readonly #bySlot = new Map<number, { claim: Lane<ClaimWaiting>; done: Lane<DoneWaiting> }>();

  constructor(private readonly conn: Connection) {}

  #lanes(key: string) {
    if (!this.conn.transport.cluster) return this.#one;
    const slot = calculateSlot(key);
    let lanes = this.#bySlot.get(slot);
    if (!lanes) this.#bySlot.set(slot, (lanes = { claim: new Lane(), done: new Lane() }));
    return lanes;
  }

  /** The loop's first claim of a call (no WAIT). */
  claim(key: string, s: Settings, payload: Bytes | undefined): Promise<Claimed> {
    if (!s.batch || this.conn.known !== 'module') return this.conn.claimFor(key, s, payload);
    const lane = this.#lanes(key).claim;
    if (lane.inFlight === 0) return this.#track(lane, this.conn.claimFor(key, s, payload), () => this.#flushClaims(lane));
    return new Promise((resolve, reject) => lane.queued.push({ key, s, payload, resolve, reject }));
  }

  /** The loop's DONE (sent once, within doneTimeout, as doneFor). */
  done(key: string, token: string, o: DoneOptions, s: Settings): Promise<{ reply: DoneReply; ack?: Ack }> {
    if (!s.batch || this.conn.known !== 'module') return this.conn.doneFor(key, token, o, s);
    const lane = this.#lanes(key).done;
    if (lane.inFlight === 0) return this.#track(lane, this.conn.doneFor(key, token, o, s), () => this.#flushDones(lane));
    return new Promise((resolve, reject) => lane.queued.push({ key, token, o, s, resolve, reject }));
  }

  /** Counts `promise` in flight on `lane`; when it settles, what queued meanwhile goes. */
  #track<T>(lane: Lane<unknown>, promise: Promise<T>, flush: () => void): Promise<T> {
    lane.inFlight++;
    const settled = () => {
      lane.inFlight--;
      if (lane.queued.length) flush();
    };
    promise.then(settled, settled);
    return promise;
  }

  #flushClaims(lane: Lane<ClaimWaiting>): void {
    this.#flush(
      lane,
      claimCompat,
      (w) => this.conn.claimFor(w.key, w.s, w.payload),
      (part) => this.conn.claimManyFor(part.map((w) => w.key), part[0]!.s, part[0]!.payload === undefined ? undefined : part.map((w) => w.payload!)),
      () => this.#flushClaims(lane),
    );
  }

  #flushDones(lane: Lane<DoneWaiting>): void {
    this.#flush(
      lane,
      doneCompat,
      (w) => this.conn.doneFor(w.key, w.token, w.o, w.s),
      (part) => this.conn.doneManyFor(part.map((w) => ({ key: w.key, token: w.token, result: w.o.result })), { retain: part[0]!.o.retain, bloom: part[0]!.o.bloom }, part[0]!.s),
      () => this.#flushDones(lane),
    );
  }

  /** What queued on `lane` goes: one command per compatible group (and per MAX_BATCH_KEYS), a group of one as its single command. */
  #flush<R, W extends Waiting<{ reply: R; ack?: Ack }>>(
    lane: Lane<W>,
    compat: (w: W) => string,
    single: (w: W) => Promise<{ reply: R; ack?: Ack }>,
    many: (part: W[]) => Promise<{ replies: BatchReply<R>[]; ack?: Ack }>,
    again: () => void,
  ): void {
    const queued = lane.queued;
    lane.queued = [];
    for (const group of groups(queued, compat)) {
      for (const indices of chunk(group.map((_, i) => i))) {
        const part = indices.map((i) => group[i]!);
        if (part.length === 1) {
          this.#track(lane, single(part[0]!), again).then(part[0]!.resolve, part[0]!.reject);
          continue;
        }
        this.#track(lane, many(part), again).then(
          ({ replies, ack }) => answer(part, replies, ack),
          (err: unknown) => part.forEach((w) => w.reject(err)),
        );
      }
    }
  }
}
