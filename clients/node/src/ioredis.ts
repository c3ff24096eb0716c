// The ioredis adapter: commands go through `callBuffer` (module commands are
// not in ioredis's command table, so `call` is its way to send them). In a
// Cluster, ioredis cannot find the key of a command it does not know, so the
// command is built as an ioredis Command with its slot set, and routed.
import calculateSlot from 'cluster-key-slot';
import { WaitPool } from './pool.js';
import type { Arg, Transport } from './transport.js';

/** The part of an ioredis `Redis` or `Cluster` the adapter uses. */
export interface IoredisLike {
  callBuffer(command: string, ...args: Arg[]): Promise<unknown>;
  sendCommand?(command: unknown): unknown;
  isCluster?: boolean;
  options?: { commandTimeout?: number };
  duplicate?(): IoredisLike;
  /** a Cluster's node clients ('master': its primaries) */
  nodes?(role?: string): IoredisLike[];
  quit?(): Promise<unknown>;
  disconnect?(): void;
}

/** ioredis's `Command` class (`import { Command } from 'ioredis'`). */
export interface IoredisCommandClass {
  new (name: string, args: Arg[], options?: { replyEncoding?: string | null }): { promise: Promise<unknown>; slot?: number | null };
}

export interface IoredisOptions {
  /** ioredis's Command class, to route module commands in a Cluster; found with `import('ioredis')` if not given */
  Command?: IoredisCommandClass;
}

export function isIoredis(client: unknown): client is IoredisLike {
  return !!client && typeof (client as IoredisLike).callBuffer === 'function';
}

export function ioredisTransport(client: IoredisLike, options: IoredisOptions = {}): Transport {
  const cluster = client.isCluster === true;
  let commandClass: Promise<IoredisCommandClass | undefined> | undefined;
  const findCommand = (): Promise<IoredisCommandClass | undefined> =>
    (commandClass ??= options.Command
      ? Promise.resolve(options.Command)
      : import('ioredis').then(
          (m) => (m as unknown as { Command?: IoredisCommandClass }).Command,
          () => undefined,
        ));
  const sendOn = async (client: IoredisLike, key: string | undefined, args: Arg[]) => {
      const [name, ...rest] = args as [string, ...Arg[]];
      if (!cluster || key === undefined || typeof client.sendCommand !== 'function') {
        return client.callBuffer(name, ...rest);
      }
      const Command = await findCommand();
      // Without the class, the command goes to any node and follows its MOVED.
      if (!Command) return client.callBuffer(name, ...rest);
      const command = new Command(name, rest, { replyEncoding: null });
      command.slot = calculateSlot(key);
      client.sendCommand(command);
      return command.promise;
  };
  const pool =
    typeof client.duplicate === 'function'
      ? new WaitPool<IoredisLike>(
          async () => client.duplicate!(),
          async (c) => (c.quit ? c.quit() : c.disconnect?.()),
        )
      : undefined;
  const timeout = client.options?.commandTimeout;
  return {
    cluster,
    maxBlock: timeout ? Math.max(1, timeout >= 2000 ? timeout - 1000 : Math.floor(timeout / 2)) : undefined,
    name: cluster ? 'ioredis Cluster' : 'ioredis',
    send: (key, args) => sendOn(client, key, args),
    sendBlocking: pool ? (key, args) => pool.use((c) => sendOn(c, key, args)) : undefined,
    primaries: async () =>
      (cluster && client.nodes ? client.nodes('master') : [client]).map((node) => (args: Arg[]) => {
        const [name, ...rest] = args as [string, ...Arg[]];
        return node.callBuffer(name, ...rest);
      }),
    close: async () => pool?.close(),
  };
}
