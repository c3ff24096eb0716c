// The node-redis adapter (the `redis` package, v5; v4's command shape too):
// a transport over `sendCommand` with Buffers for bulk strings (a client, a
// cluster, or v5's sentinel), and the typed commands as a node-redis module:
//
//   const client = createClient({ modules: { idem: idemModule } });
//   const reply = await client.idem.claim('order:1', 30, { payload: body });
import * as c from './commands.js';
import { ConnectionLostError } from './errors.js';
import { WaitPool } from './pool.js';
import type { Arg, Transport } from './transport.js';
import type { ClaimOptions, DoneOptions, ReserveOptions } from './types.js';

/**
 * Bulk strings as Buffers, so that results stay byte-exact: v5 maps RESP
 * type 36 (blob string) to Buffer; v4 reads `returnBuffers`. Each ignores
 * the other's option.
 */
const BLOB_STRING = 36;
const BUFFERS = { typeMapping: { [BLOB_STRING]: Buffer }, returnBuffers: true };

/** The part of a node-redis client (`createClient`), cluster (`createCluster`) or sentinel (`createSentinel`) the adapter uses. */
export interface NodeRedisLike {
  sendCommand(...args: any[]): Promise<unknown>;
  duplicate?(): NodeRedisLike & { connect(): Promise<unknown>; on(event: string, fn: (...a: unknown[]) => void): unknown };
  quit?(): Promise<unknown>;
  close?(): Promise<unknown>;
  destroy?(): void;
  /** a cluster's primaries (v4 and v5), each reached with `nodeClient` */
  masters?: unknown[];
  nodeClient?(node: unknown): NodeRedisLike | Promise<NodeRedisLike>;
}

/** A node-redis (v5) sentinel: `_execute` runs a function with the primary's client (the way its own sendCommand, multi and use do). */
interface SentinelLike {
  sendCommand(isReadonly: boolean, args: Arg[], options?: unknown): Promise<unknown>;
  _execute<T>(isReadonly: boolean, fn: (client: NodeRedisLike) => Promise<T>): Promise<T>;
  getMasterNode(): unknown;
}

export function isNodeRedis(client: unknown): client is NodeRedisLike {
  return !!client && typeof (client as NodeRedisLike).sendCommand === 'function' && !('callBuffer' in (client as object));
}

const isNodeRedisCluster = (client: object): boolean =>
  'masters' in client || typeof (client as { getSlotMaster?: unknown }).getSlotMaster === 'function';

const isSentinel = (client: object): client is SentinelLike =>
  typeof (client as SentinelLike).getMasterNode === 'function' && typeof (client as SentinelLike)._execute === 'function';

const asStrings = (args: Arg[]) => args.map((a) => (typeof a === 'number' ? String(a) : a));

/** A duplicate of `client` for waits, connected. */
async function connected(client: NodeRedisLike) {
  const dup = client.duplicate!();
  dup.on('error', () => undefined); // a broken wait connection fails its command; nothing more
  await dup.connect();
  return dup;
}

export function nodeRedisTransport(client: NodeRedisLike): Transport {
  if (isSentinel(client)) return sentinelTransport(client);
  const cluster = isNodeRedisCluster(client);
  const sendOn = (on: NodeRedisLike, key: string | undefined, args: Arg[]) =>
    cluster ? on.sendCommand(key, false, asStrings(args), BUFFERS) : on.sendCommand(asStrings(args), BUFFERS);
  const pool =
    typeof client.duplicate === 'function'
      ? new WaitPool<NodeRedisLike>(
          () => connected(client),
          async (d) => (d.close ? d.close() : d.quit?.()),
        )
      : undefined;
  // Sent in one tick, the commands are written together on the connection that serves `key`.
  const pipelineOn = (on: NodeRedisLike, key: string | undefined, commands: Arg[][]) => settleAll(commands.map((args) => sendOn(on, key, args)));
  return {
    cluster,
    name: cluster ? 'node-redis cluster' : 'node-redis',
    // node-redis never resends a command by itself: one whose connection closes is rejected.
    send: (key, args) => sendOn(client, key, args),
    sendBlocking: pool ? (key, args) => pool.use((d) => sendOn(d, key, args)) : undefined,
    pipeline: (key, commands, mode) => (mode === 'blocking' && pool ? pool.use((d) => pipelineOn(d, key, commands)) : pipelineOn(client, key, commands)),
    primaries: async () => {
      if (!cluster || !client.masters || !client.nodeClient) return [(args: Arg[]) => sendOn(client, undefined, args)];
      const nodes = await Promise.all(client.masters.map((master) => client.nodeClient!(master)));
      return nodes.map((node) => (args: Arg[]) => node.sendCommand(asStrings(args), BUFFERS));
    },
    close: async () => pool?.close(),
  };
}

/**
 * Each command's reply (an error reply as its Error); a lost connection
 * (any error but an error reply) rejects the whole.
 */
async function settleAll(sent: Promise<unknown>[]): Promise<unknown[]> {
  const replies = await Promise.all(sent.map((p) => p.then((r) => r, (err: unknown) => err)));
  const lost = replies.find((r) => r instanceof Error && !/^[A-Z][A-Z_-]* /.test(r.message));
  if (lost) throw lost;
  return replies;
}

/**
 * node-redis's sentinel client: each command on the primary's client
 * (`_execute`), which resends a command by itself, on the new primary, when
 * its connection closed or it was answered READONLY. The loop's DONE and
 * RELEASE go once: a second run of the function fails as a lost
 * connection, for the loop to decide. Waits run on a duplicate of the
 * primary's client, made when needed (after a failover: of the new one).
 */
function sentinelTransport(sentinel: SentinelLike): Transport {
  const on = <T>(fn: (client: NodeRedisLike) => Promise<T>) => sentinel._execute(false, fn);
  const sendOn = (c: NodeRedisLike, args: Arg[]) => c.sendCommand(asStrings(args), BUFFERS);
  const once = <T>(name: string, fn: (client: NodeRedisLike) => Promise<T>) => {
    let sent = false;
    return on((c) => {
      if (sent) return Promise.reject(new ConnectionLostError(name));
      sent = true;
      return fn(c);
    });
  };
  const pool = new WaitPool<NodeRedisLike>(
    () => on(async (c) => connected(c)),
    async (d) => (d.close ? d.close() : d.quit?.()),
  );
  const pipelineOn = (c: NodeRedisLike, commands: Arg[][]) => settleAll(commands.map((args) => sendOn(c, args)));
  return {
    cluster: false,
    name: 'node-redis sentinel',
    send: (_key, args) => on((c) => sendOn(c, args)),
    sendOnce: (_key, args) => once(String(args[0]), (c) => sendOn(c, args)),
    sendBlocking: (_key, args) => pool.use((d) => sendOn(d, args)),
    pipeline: (_key, commands, mode) =>
      mode === 'blocking'
        ? pool.use((d) => pipelineOn(d, commands))
        : mode === 'once'
          ? once(String(commands[0]![0]), (c) => pipelineOn(c, commands))
          : on((c) => pipelineOn(c, commands)),
    primaries: async () => [(args: Arg[]) => on((c) => sendOn(c, args))],
    close: async () => pool.close(),
  };
}

/** The shape of a node-redis command parser (v5). */
export interface CommandParser {
  push(...args: (string | Buffer)[]): void;
  pushKey(key: string | Buffer): void;
}

type Build<A extends unknown[]> = (...args: A) => Arg[];

/**
 * One typed command for node-redis: v5's `parseCommand` (the key pushed as
 * a key, so clusters route it) and v4's `transformArguments` with
 * `FIRST_KEY_INDEX`, and the reply decoded as the Idem class decodes it.
 */
function define<A extends unknown[], R>(build: Build<A>, transformReply: (reply: unknown) => R, readOnly = false) {
  const strings = (args: Arg[]) => args.map((a) => (typeof a === 'number' ? String(a) : a));
  return {
    IS_READ_ONLY: readOnly,
    FIRST_KEY_INDEX: 1,
    parseCommand(parser: CommandParser, ...args: A) {
      const [name, key, ...rest] = strings(build(...args));
      parser.push(name as string);
      parser.pushKey(key as string | Buffer);
      if (rest.length) parser.push(...rest);
    },
    transformArguments: (...args: A) => strings(build(...args)),
    transformReply,
  } as const;
}

/**
 * The module's commands for `createClient({ modules: { idem: idemModule } })`:
 * `client.idem.claim(key, lease, options)` and the others, with the replies
 * of types.ts. Module edition only (use the Idem class for both editions);
 * the batch commands are the Idem class's, which splits them by slot.
 */
export const idemModule = {
  claim: define((key: string, lease: number, o?: ClaimOptions) => c.claimArgs('module', key, lease, o), c.parseClaim),
  done: define((key: string, token: string, o?: DoneOptions) => c.doneArgs('module', key, token, o), c.parseDone),
  release: define((key: string, token: string) => c.releaseArgs('module', key, token), c.parseBoolean),
  extend: define((key: string, token: string, lease: number) => c.extendArgs('module', key, token, lease), c.parseExtend),
  get: define((key: string) => c.getArgs('module', key), c.parseGet, true),
  once: define((key: string, retain: number) => c.onceArgs('module', key, retain), c.parseBoolean),
  bfReserve: define(
    (key: string, errorRate: number, capacity: number, o?: ReserveOptions) => c.reserveArgs('module', key, errorRate, capacity, o),
    (reply: unknown) => String(reply) === 'OK',
  ),
  bfAdd: define((key: string, item: string) => c.bfAddArgs('module', key, item), c.parseBoolean),
  bfMadd: define((key: string, items: string[]) => c.bfMaddArgs('module', key, items), c.parseBooleans),
  bfExists: define((key: string, item: string) => c.bfExistsArgs('module', key, item), c.parseBoolean, true),
  bfMexists: define((key: string, items: string[]) => c.bfMexistsArgs('module', key, items), c.parseBooleans, true),
  bfInfo: define((key: string) => c.bfInfoArgs('module', key), c.parseFilterInfo, true),
};
