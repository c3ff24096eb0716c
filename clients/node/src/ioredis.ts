// The ioredis adapter. Module commands are not in ioredis's command table,
// so each is built as an ioredis `Command` (Buffer replies) and sent with
// `sendCommand`; in a Cluster with its slot set, so that it is routed.
// Sentinel (`new Redis({ sentinels, name })`) needs nothing more: ioredis
// finds the primary and reconnects to the new one after a failover.
//
// ioredis resends by itself, after a reconnect, every command whose reply
// had not come (autoResendUnfulfilledCommands), and an ioredis Cluster does
// the same for a command whose connection closed. The loop's DONE and
// RELEASE must reach the server at most as often as the loop sends them
// (docs/clients.md: at most 1 + done_retries DONEs), so `sendOnce` writes
// the command's bytes once: a second write (ioredis's resend) writes a PING
// in its place, which keeps ioredis's replies in step, and the command then
// fails as a lost connection, for the loop to decide.
import calculateSlot from 'cluster-key-slot';
import { ConnectionLostError } from './errors.js';
import { WaitPool } from './pool.js';
import type { Arg, Transport } from './transport.js';

/** The part of an ioredis `Redis` or `Cluster` the adapter uses. */
export interface IoredisLike {
  callBuffer(command: string, ...args: Arg[]): Promise<unknown>;
  sendCommand?(command: unknown): unknown;
  isCluster?: boolean;
  options?: { commandTimeout?: number };
  duplicate?(): IoredisLike;
  on?(event: string, listener: (...args: unknown[]) => void): unknown;
  /** a Cluster's node clients ('master': its primaries) */
  nodes?(role?: string): IoredisLike[];
  quit?(): Promise<unknown>;
  disconnect?(): void;
}

/** An ioredis `Command` as the adapter uses it. */
interface IoredisCommand {
  promise: Promise<unknown>;
  slot?: number | null;
  toWritable(socket: unknown): string | Buffer;
}

/** ioredis's `Command` class (`import { Command } from 'ioredis'`). */
export interface IoredisCommandClass {
  new (name: string, args: Arg[], options?: { replyEncoding?: string | null }): IoredisCommand;
}

export interface IoredisOptions {
  /** ioredis's Command class; found on the client's class (Redis.Command), else with `import('ioredis')` */
  Command?: IoredisCommandClass;
}

export function isIoredis(client: unknown): client is IoredisLike {
  return !!client && typeof (client as IoredisLike).callBuffer === 'function';
}

const PING = '*1\r\n$4\r\nPING\r\n';

/** `command` written once: a resend writes PING instead and marks it, so its reply is taken for a lost connection. */
function writeOnce(command: IoredisCommand): { resent: boolean } {
  const state = { resent: false };
  const toWritable = command.toWritable;
  let written = false;
  command.toWritable = function (this: IoredisCommand, socket: unknown) {
    if (written) {
      state.resent = true;
      return PING;
    }
    written = true;
    return toWritable.call(this, socket);
  };
  return state;
}

export function ioredisTransport(client: IoredisLike, options: IoredisOptions = {}): Transport {
  const cluster = client.isCluster === true;
  const ownClass = (client.constructor as { Command?: IoredisCommandClass } | undefined)?.Command;
  let Command: IoredisCommandClass | undefined = options.Command ?? ownClass;
  let finding: Promise<void> | undefined;
  const findCommand = (): Promise<void> =>
    (finding ??= import('ioredis').then(
      (m) => void (Command ??= (m as unknown as { Command?: IoredisCommandClass }).Command),
      () => undefined,
    ));

  /** The command built and sent on `on`; `once`: never written twice. */
  const sendOn = (on: IoredisLike, key: string | undefined, args: Arg[], once = false): Promise<unknown> => {
    const [name, ...rest] = args as [string, ...Arg[]];
    if (!Command || typeof on.sendCommand !== 'function') {
      // Without the class (not found yet: found for the next command), ioredis builds it; a Cluster then sends it to any node, which redirects.
      if (!finding) void findCommand();
      return on.callBuffer(name, ...rest);
    }
    const command = new Command(name, rest, { replyEncoding: null });
    if (cluster && key !== undefined) command.slot = calculateSlot(key);
    if (!once) {
      on.sendCommand(command);
      return command.promise;
    }
    const state = writeOnce(command);
    on.sendCommand(command);
    return command.promise.then((reply) => {
      if (state.resent) throw new ConnectionLostError(name);
      return reply;
    });
  };

  /** Several commands written back to back on the connection that serves `key` (one Cluster node: one slot for all). */
  const pipelineOn = async (on: IoredisLike, key: string | undefined, commands: Arg[][], once: boolean): Promise<unknown[]> => {
    if (!Command) await findCommand();
    const sent = commands.map((args) => sendOn(on, key, args, once).then(
      (reply) => reply,
      (err: unknown) => err, // an error reply is its element; a lost connection fails the whole below
    ));
    const replies = await Promise.all(sent);
    const lost = replies.find((r) => r instanceof Error && !isReplyText(r.message));
    if (lost) throw lost;
    return replies;
  };

  const pool =
    typeof client.duplicate === 'function'
      ? new WaitPool<IoredisLike>(
          async () => {
            const dup = client.duplicate!();
            dup.on?.('error', () => undefined); // a broken wait connection fails its command; nothing more
            return dup;
          },
          async (c) => (c.quit ? c.quit() : c.disconnect?.()),
        )
      : undefined;
  const timeout = client.options?.commandTimeout;
  return {
    cluster,
    maxBlock: timeout ? Math.max(1, timeout >= 2000 ? timeout - 1000 : Math.floor(timeout / 2)) : undefined,
    name: cluster ? 'ioredis Cluster' : 'ioredis',
    send: (key, args) => sendOn(client, key, args),
    sendOnce: (key, args) => sendOn(client, key, args, true),
    sendBlocking: pool ? (key, args) => pool.use((c) => sendOn(c, key, args)) : undefined,
    pipeline: (key, commands, mode) =>
      mode === 'blocking' && pool ? pool.use((c) => pipelineOn(c, key, commands, false)) : pipelineOn(client, key, commands, mode === 'once'),
    primaries: async () =>
      (cluster && client.nodes ? client.nodes('master') : [client]).map((node) => (args: Arg[]) => {
        const [name, ...rest] = args as [string, ...Arg[]];
        return node.callBuffer(name, ...rest);
      }),
    close: async () => pool?.close(),
  };
}

/** An error reply's text (ioredis's ReplyError): an upper-case code, then a space. */
const isReplyText = (message: string) => /^[A-Z][A-Z_-]* /.test(message);
