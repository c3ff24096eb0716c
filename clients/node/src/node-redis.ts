// The node-redis adapter (the `redis` package, v5; v4's command shape too):
// a transport over `sendCommand` with Buffers for bulk strings, and the
// typed commands as a node-redis module:
//
//   const client = createClient({ modules: { idem: idemModule } });
//   const reply = await client.idem.claim('order:1', 30, { payload: body });
import * as c from './commands.js';
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

/** The part of a node-redis client (`createClient`) or cluster (`createCluster`) the adapter uses. */
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

export function isNodeRedis(client: unknown): client is NodeRedisLike {
  return !!client && typeof (client as NodeRedisLike).sendCommand === 'function' && !('callBuffer' in (client as object));
}

const isNodeRedisCluster = (client: object): boolean =>
  'masters' in client || typeof (client as { getSlotMaster?: unknown }).getSlotMaster === 'function';

export function nodeRedisTransport(client: NodeRedisLike): Transport {
  const cluster = isNodeRedisCluster(client);
  const asStrings = (args: Arg[]) => args.map((a) => (typeof a === 'number' ? String(a) : a));
  const sendOn = (client: NodeRedisLike, key: string | undefined, args: Arg[]) =>
    cluster ? client.sendCommand(key, false, asStrings(args), BUFFERS) : client.sendCommand(asStrings(args), BUFFERS);
  const pool =
    typeof client.duplicate === 'function'
      ? new WaitPool<NodeRedisLike>(
          async () => {
            const dup = client.duplicate!();
            dup.on('error', () => undefined); // a broken wait connection fails its command; nothing more
            await dup.connect();
            return dup;
          },
          async (d) => (d.close ? d.close() : d.quit?.()),
        )
      : undefined;
  return {
    cluster,
    name: cluster ? 'node-redis cluster' : 'node-redis',
    send: (key, args) => sendOn(client, key, args),
    sendBlocking: pool ? (key, args) => pool.use((d) => sendOn(d, key, args)) : undefined,
    primaries: async () => {
      if (!cluster || !client.masters || !client.nodeClient) return [(args: Arg[]) => sendOn(client, undefined, args)];
      const nodes = await Promise.all(client.masters.map((master) => client.nodeClient!(master)));
      return nodes.map((node) => (args: Arg[]) => node.sendCommand(asStrings(args), BUFFERS));
    },
    close: async () => pool?.close(),
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
