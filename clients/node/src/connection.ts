// One server (or cluster) through a Transport: which edition it runs, its
// idem.max-result, and every command sent for that edition with its reply
// decoded and its error reply typed. Keys here are the stored ones (the
// prefix applied already).
import * as c from './commands.js';
import { NotInstalledError, replyError } from './errors.js';
import { type Arg, type Transport, text } from './transport.js';
import type { ClaimOptions, ClaimReply, DoneOptions, DoneReply, Edition, RecordInfo, ScanOptions } from './types.js';

/** The module's default idem.max-result, and the Functions edition's constant. */
export const DEFAULT_MAX_RESULT = 1048576;

export class Connection {
  #edition?: Promise<Edition>;
  #maxResult?: Promise<number>;

  constructor(
    readonly transport: Transport,
    edition?: Edition,
    private readonly knownMaxResult?: number,
  ) {
    if (edition) this.#edition = Promise.resolve(edition);
  }

  /** The module (COMMAND INFO knows IDEM.CLAIM) or the Functions library (FCALL_RO idem_edition 0); asked once. */
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
    throw new NotInstalledError(
      'neither the redis-idem module nor its Functions library answers on this server: load the module ' +
        '(loadmodule /path/to/libredis_idem.so) or the library (redis-cli -x FUNCTION LOAD REPLACE < functions/idem.lua)',
    );
  }

  /** idem.max-result: the option, else the module's config, else the default. */
  maxResult(): Promise<number> {
    if (this.knownMaxResult !== undefined) return Promise.resolve(this.knownMaxResult);
    this.#maxResult ??= this.edition().then(async (edition) => {
      if (edition === 'functions') return DEFAULT_MAX_RESULT;
      try {
        const reply = (await this.transport.send(undefined, ['CONFIG', 'GET', 'idem.max-result'])) as unknown;
        const pairs = Array.isArray(reply) ? reply : reply instanceof Map ? [...reply.entries()].flat() : [];
        const value = Number(text(pairs[1]));
        return Number.isFinite(value) && value > 0 ? value : DEFAULT_MAX_RESULT;
      } catch {
        return DEFAULT_MAX_RESULT; // CONFIG is often refused on managed servers; the server refuses a larger RESULT anyway
      }
    });
    return this.#maxResult;
  }

  /** Sends a command built for the server's edition; an error reply rejects with its typed error. */
  async send<T>(key: string | undefined, build: (edition: Edition) => Arg[], parse: (reply: unknown) => T, blocking = false): Promise<T> {
    const args = build(await this.edition());
    let reply: unknown;
    try {
      const t = this.transport;
      reply = await (blocking && t.sendBlocking ? t.sendBlocking(key, args) : t.send(key, args));
    } catch (err) {
      throw replyError(err);
    }
    return parse(reply);
  }

  claim(key: string, lease: number, o: ClaimOptions = {}): Promise<ClaimReply> {
    // A claim that waits runs on a connection of its own (pool.ts says why).
    return this.send(key, (e) => c.claimArgs(e, key, lease, o), c.parseClaim, !!o.wait);
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
