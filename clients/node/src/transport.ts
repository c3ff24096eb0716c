// What the library needs of a Redis client: send one command (routed by its
// key in a cluster) and get the raw reply, bulk strings as Buffers, error
// elements of arrays as Error objects. ioredis.ts and node-redis.ts adapt
// each client to it.

export type Arg = string | Buffer | number;

export interface Transport {
  /** Sends `args` (command name first); `key` routes it in a cluster. Rejects with the client's error on an error reply. */
  send(key: string | undefined, args: Arg[]): Promise<unknown>;
  /** True for a cluster client: batches are split by slot. */
  readonly cluster: boolean;
  /** The longest a command may block (the client's command timeout, less a margin): a longer WAIT goes in pieces. */
  readonly maxBlock?: number;
  /** The client's name, for messages. */
  readonly name: string;
  /** Sends a command that may block (CLAIM ... WAIT) on a connection of its own; `send` where absent. */
  sendBlocking?(key: string | undefined, args: Arg[]): Promise<unknown>;
  /**
   * Sends a command the client must not send again by itself after a
   * reconnect (the loop's DONE and RELEASE: it decides, and bounds, their
   * resends); its connection closing before the reply rejects. `send` where absent.
   */
  sendOnce?(key: string | undefined, args: Arg[]): Promise<unknown>;
  /**
   * Sends `commands` on one connection, written together (a command and the
   * WAIT of `durable`: WAIT counts the acknowledgements of its own
   * connection's writes), the one `key` routing them all; resolves with each
   * reply, an error reply as its Error. `mode`: 'blocking' on a connection
   * of its own, as sendBlocking; 'once', as sendOnce. Needed for `durable`.
   */
  pipeline?(key: string | undefined, commands: Arg[][], mode?: 'blocking' | 'once'): Promise<unknown[]>;
  /**
   * A sender per primary, for the commands that read one node's keys (IDEM.SCAN):
   * a cluster's primaries as the client knows them now. Absent: `send` reaches the one server.
   */
  primaries?(): Promise<((args: Arg[]) => Promise<unknown>)[]>;
  /** Closes the connections the transport opened itself (never the user's client). */
  close?(): Promise<void>;
}

/** A reply element as text (simple strings may come as Buffers). */
export function text(value: unknown): string {
  if (Buffer.isBuffer(value)) return value.toString('utf8');
  if (value instanceof Uint8Array) return Buffer.from(value).toString('utf8');
  return String(value);
}

export function bytes(value: unknown): Buffer | null {
  if (value === null || value === undefined) return null;
  if (Buffer.isBuffer(value)) return value;
  if (value instanceof Uint8Array) return Buffer.from(value);
  return Buffer.from(String(value), 'utf8');
}

export function int(value: unknown): number {
  if (typeof value === 'number') return value;
  if (typeof value === 'bigint') return Number(value);
  return Number(text(value));
}

/** A map reply (RESP3 map, object, or RESP2 flat field-value array) as entries. */
export function entries(reply: unknown): [string, unknown][] {
  if (reply instanceof Map) return [...reply.entries()].map(([k, v]) => [text(k), v]);
  if (Array.isArray(reply)) {
    const out: [string, unknown][] = [];
    for (let i = 0; i + 1 < reply.length; i += 2) out.push([text(reply[i]), reply[i + 1]]);
    return out;
  }
  if (reply && typeof reply === 'object') return Object.entries(reply);
  throw new TypeError(`expected a map reply, got ${typeof reply}`);
}
