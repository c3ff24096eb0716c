// One server (or cluster) through a Transport: which edition it runs, its
// idem.max-result, and every command sent for that edition with its reply
// decoded and its error reply typed. Keys here are the stored ones (the
// prefix applied already). The loop's own claims, DONEs and RELEASEs go
// through claimFor / doneFor / releaseFor: with `durable` each is followed
// by WAIT on its connection, and DONE and RELEASE are sent once (the client
// below never resends them by itself) with a deadline on the instance's clock.
import type { Clock } from './clock.js';
import * as c from './commands.js';
import { acknowledged, waitArgs } from './core.js';
import { NotInstalledError, replyError } from './errors.js';
import type { Settings } from './settings.js';
import { type Arg, type Transport, text } from './transport.js';
import type { BatchReply, Bytes, ClaimOptions, ClaimReply, DoneOptions, DoneReply, Edition, RecordInfo, ScanOptions } from './types.js';

/** The module's default idem.max-result, and the Functions edition's constant. */
export const DEFAULT_MAX_RESULT = 1048576;

/** WAIT's answer after a command, with `durable`. */
export interface Ack {
  durable: boolean;
  /** replicas (WAITAOF: replicas that fsynced) that acknowledged; -1: WAITAOF refused */
  count: number;
}

/**
 * Commands written right after the loop's DONE on its connection, before
 * the WAIT of `durable` (a broker's acknowledgement that lives on the same
 * server: Streams' XACK); `replied` gets their replies (an error reply as
 * its Error) for every DONE sent whose replies came, even one answered
 * with an error.
 */
export interface Ride {
  commands: Arg[][];
  replied(replies: unknown[]): void;
}

/** A DONE's answer, and WAIT's with `durable`. */
export interface Done {
  reply: DoneReply;
  ack?: Ack;
}

/** A claim's answer, and WAIT's with `durable`. */
export interface Claimed {
  reply: ClaimReply;
  ack?: Ack;
}

const typed = (err: unknown): never => {
  throw replyError(err);
};
const claimed = (reply: unknown): Claimed => ({ reply: c.parseClaim(reply) });
const done = (reply: unknown): { reply: DoneReply } => ({ reply: c.parseDone(reply) });

export class Connection {
  #edition?: Promise<Edition>;
  #maxResult?: Promise<number>;
  /** the edition, once known (the hot path reads it without awaiting) */
  known?: Edition;
  /** idem.max-result, once known */
  knownMaxResult?: number;

  constructor(
    readonly transport: Transport,
    readonly clock: Clock,
    edition?: Edition,
    maxResult?: number,
  ) {
    if (edition) {
      this.known = edition;
      this.#edition = Promise.resolve(edition);
    }
    if (maxResult !== undefined) {
      this.knownMaxResult = maxResult;
      this.#maxResult = Promise.resolve(maxResult);
    }
  }

  /** The module (COMMAND INFO knows IDEM.CLAIM) or the Functions library (FCALL_RO idem_edition 0); asked once. */
  edition(): Promise<Edition> {
    this.#edition ??= this.#detect().then(
      (edition) => (this.known = edition),
      (err: unknown) => {
        this.#edition = undefined;
        throw err;
      },
    );
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
    throw new NotInstalledError(
      'neither the redis-idem module nor its Functions library answers on this server: load the module ' +
        '(loadmodule /path/to/libredis_idem.so) or the library (redis-cli -x FUNCTION LOAD REPLACE < functions/idem.lua)',
    );
  }

  /** idem.max-result: the option, else the module's config, else the default. */
  maxResult(): Promise<number> {
    this.#maxResult ??= this.edition().then(async (edition) => {
      let value = DEFAULT_MAX_RESULT;
      if (edition === 'module') {
        try {
          const reply = (await this.transport.send(undefined, ['CONFIG', 'GET', 'idem.max-result'])) as unknown;
          const pairs = Array.isArray(reply) ? reply : reply instanceof Map ? [...reply.entries()].flat() : [];
          const read = Number(text(pairs[1]));
          if (Number.isFinite(read) && read > 0) value = read;
        } catch {
          // CONFIG is often refused on managed servers; the server refuses a larger RESULT anyway
        }
      }
      return (this.knownMaxResult = value);
    });
    return this.#maxResult;
  }

  /** Sends a command built for the server's edition; an error reply rejects with its typed error. */
  async send<T>(key: string | undefined, build: (edition: Edition) => Arg[], parse: (reply: unknown) => T, mode?: 'blocking' | 'once'): Promise<T> {
    const args = build(this.known ?? (await this.edition()));
    let reply: unknown;
    try {
      const t = this.transport;
      reply = await (mode === 'blocking' && t.sendBlocking ? t.sendBlocking(key, args) : mode === 'once' && t.sendOnce ? t.sendOnce(key, args) : t.send(key, args));
    } catch (err) {
      throw replyError(err);
    }
    return parse(reply);
  }

  /** `commands` on one connection (transport.pipeline): each reply, an error reply as its typed Error; a failed connection rejects. */
  async pipeline(key: string | undefined, commands: Arg[][], mode?: 'blocking' | 'once'): Promise<unknown[]> {
    if (!this.transport.pipeline) throw new TypeError(`durable needs a transport that sends a command and its WAIT on one connection (${this.transport.name} has no pipeline)`);
    try {
      return (await this.transport.pipeline(key, commands, mode)).map((reply) => (reply instanceof Error ? replyError(reply) : reply));
    } catch (err) {
      throw replyError(err);
    }
  }

  /** Prebuilt arguments sent as `mode` says; the reply parsed; an error reply rejects typed. */
  #sendArgs<T>(key: string, args: Arg[], parse: (reply: unknown) => T, mode?: 'blocking' | 'once'): Promise<T> {
    const t = this.transport;
    const sent = mode === 'blocking' && t.sendBlocking ? t.sendBlocking(key, args) : mode === 'once' && t.sendOnce ? t.sendOnce(key, args) : t.send(key, args);
    return sent.then(parse, typed);
  }

  /** The loop's claim: the instance's OWNER, `wait` ms of WAIT (on a connection of its own), and WAIT after it with `durable`. */
  claimFor(key: string, s: Settings, payload: Bytes | undefined, wait?: number): Promise<Claimed> {
    const edition = this.known;
    if (edition === undefined) return this.edition().then(() => this.claimFor(key, s, payload, wait));
    const args = c.claimArgs(edition, key, s.lease, { payload, maxTries: s.maxTries, bloom: s.bloom, wait, owner: s.owner });
    const mode = wait ? 'blocking' : undefined;
    const durable = s.durable;
    if (durable === undefined) return this.#sendArgs(key, args, claimed, mode);
    return this.pipeline(key, [args, waitArgs(durable)], mode).then(([reply, ack]) => {
      if (reply instanceof Error) throw reply;
      return { reply: c.parseClaim(reply), ack: acknowledged(durable, ack) };
    });
  }

  /** The loop's DONE: sent once, within `doneTimeout`, `ride`'s commands and WAIT (with `durable`) after it on its connection. */
  doneFor(key: string, token: string, o: DoneOptions, s: Settings, ride?: Ride): Promise<Done> {
    const edition = this.known;
    if (edition === undefined) return this.edition().then(() => this.doneFor(key, token, o, s, ride));
    const args = c.doneArgs(edition, key, token, o);
    const durable = s.durable;
    if (durable === undefined && ride === undefined) return this.clock.deadline(this.#sendArgs(key, args, done, 'once'), s.doneTimeout, 'DONE');
    const riders = ride?.commands ?? [];
    const commands = durable === undefined ? [args, ...riders] : [args, ...riders, waitArgs(durable)];
    const sent = this.pipeline(key, commands, 'once').then((replies) => {
      if (ride) ride.replied(replies.slice(1, 1 + riders.length));
      const reply = replies[0];
      if (reply instanceof Error) throw reply;
      const parsed = c.parseDone(reply);
      return durable === undefined ? { reply: parsed } : { reply: parsed, ack: acknowledged(durable, replies[1 + riders.length]) };
    });
    return this.clock.deadline(sent, s.doneTimeout, 'DONE');
  }

  /** The loop's RELEASE: sent once, within `doneTimeout`; true when it answered 1. */
  releaseFor(key: string, token: string, s: Settings): Promise<boolean> {
    return this.clock.deadline(this.send(key, (e) => c.releaseArgs(e, key, token), c.parseBoolean, 'once'), s.doneTimeout, 'RELEASE');
  }

  /** Many loop claims in one IDEM.MCLAIM (module; keys of one slot): one answer per key, and WAIT's with `durable`. */
  async claimManyFor(keys: string[], s: Settings, payloads: Bytes[] | undefined): Promise<{ replies: BatchReply<ClaimReply>[]; ack?: Ack }> {
    const args = c.mclaimArgs(keys, s.lease, { payloads, maxTries: s.maxTries, bloom: s.bloom, owner: s.owner });
    const parse = (r: unknown) => c.parseBatch(r, c.parseClaim);
    if (s.durable === undefined) return { replies: await this.send(keys[0], () => args, parse) };
    const [reply, ack] = await this.pipeline(keys[0], [args, waitArgs(s.durable)]);
    if (reply instanceof Error) throw reply;
    return { replies: parse(reply), ack: acknowledged(s.durable, ack) };
  }

  /** Many loop DONEs in one IDEM.MDONE (module; keys of one slot; results for all or none): sent once, within `doneTimeout`. */
  async doneManyFor(items: { key: string; token: string; result?: Bytes }[], o: { retain?: number; bloom?: string }, s: Settings): Promise<{ replies: BatchReply<DoneReply>[]; ack?: Ack }> {
    const args = c.mdoneArgs(items, o);
    const parse = (r: unknown) => c.parseBatch(r, c.parseDone);
    const key = items[0]!.key;
    if (s.durable === undefined) return { replies: await this.clock.deadline(this.send(key, () => args, parse, 'once'), s.doneTimeout, 'MDONE') };
    const [reply, ack] = await this.clock.deadline(this.pipeline(key, [args, waitArgs(s.durable)], 'once'), s.doneTimeout, 'MDONE');
    if (reply instanceof Error) throw reply;
    return { replies: parse(reply), ack: acknowledged(s.durable, ack) };
  }

  claim(key: string, lease: number, o: ClaimOptions = {}): Promise<ClaimReply> {
    // A claim that waits runs on a connection of its own (pool.ts says why).
    return this.send(key, (e) => c.claimArgs(e, key, lease, o), c.parseClaim, o.wait ? 'blocking' : undefined);
  }

  done(key: string, token: string, o: DoneOptions = {}): Promise<DoneReply> {
    return this.send(key, (e) => c.doneArgs(e, key, token, o), c.parseDone);
  }

  release(key: string, token: string): Promise<boolean> {
    return this.send(key, (e) => c.releaseArgs(e, key, token), c.parseBoolean);
  }

  extend(key: string, token: string, lease: number): Promise<void> {
    return this.send(key, (e) => c.extendArgs(e, key, token, lease), c.parseExtend);
  }

  get(key: string): Promise<RecordInfo | null> {
    return this.send(key, (e) => c.getArgs(e, key), c.parseGet);
  }

  requeue(key: string): Promise<boolean> {
    return this.send(key, (e) => c.requeueArgs(e, key), c.parseBoolean);
  }

  /** The stored keys of every record matching `o`, each primary in turn (a scan step reads one node's keys). */
  async *scan(o: ScanOptions): AsyncGenerator<string> {
    const build = (edition: Edition, cursor: string) => c.scanArgs(edition, cursor, o);
    const edition = await this.edition();
    build(edition, '0'); // a bad option throws before any node is asked
    const nodes = this.transport.primaries ? await this.transport.primaries() : [(args: Arg[]) => this.transport.send(undefined, args)];
    for (const node of nodes) {
      let cursor = '0';
      do {
        let reply: unknown;
        try {
          reply = await node(build(edition, cursor));
        } catch (err) {
          throw replyError(err);
        }
        const step = c.parseScan(reply);
        cursor = step.cursor;
        yield* step.keys;
      } while (cursor !== '0');
    }
  }
}
