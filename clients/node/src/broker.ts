// What the broker adapters (kafka.ts, amqp.ts, streams.ts) share
// (docs/clients.md, "Consumers of brokers"): what a process() call's end
// means for the message, the delays it is given back with, and the
// adapters' counters. Each adapter runs the library's own loop (loop.ts)
// with the Idem's parts; none decides anything about claims or DONE.
import type { Job, Stats } from './core.js';
import { ExhaustedError, HookError, MismatchError, MissingKeyError, BusyError, ResultNotStoredError } from './errors.js';
import type { Idem } from './idem.js';
import { idemRuntime } from './idem.js';
import type { Ride } from './connection.js';
import { type Outcome, type Runtime, process } from './loop.js';
import type { ProcessOptions } from './settings.js';
import type { Bytes } from './types.js';

/**
 * What the adapter does with a message after process(): acknowledge it (its
 * record is done: the work ran and DONE was confirmed, or a replay), hold it
 * back (give it back to come again after `delay` ms: Busy, a failed work, a
 * DONE not confirmed, a lost lease, not durable), or dead-letter it and then
 * acknowledge it (Exhausted, Mismatch, a message without a key).
 */
export type Verdict = 'ack' | 'hold' | 'dead-letter';

export interface Decision {
  verdict: Verdict;
  /** ms (hold) */
  delay: number;
  /** why it was held back or dead-lettered (or the completed record's ResultNotStored / onDone HookError) */
  error?: unknown;
}

/** The least a message is held back: a holder whose lease is about to end is not spun on. */
export const MIN_DELAY = 100;
/** The longest a failed message is held back. */
export const MAX_RETRY_DELAY = 30000;
/** How long a failed message is first held back by default (doubling each time it fails again). */
export const DEFAULT_RETRY_DELAY = 100;

/** The delay of a message that failed `before` times already: `base` doubling, at most MAX_RETRY_DELAY. */
export const backoff = (base: number, before: number): number => Math.min(MAX_RETRY_DELAY, base * 2 ** Math.min(Math.max(0, before), 20));

/** process()'s end (undefined: it resolved) as the adapter's verdict; `retry` is a failure's delay. */
export function decide(error: unknown, retry: number): Decision {
  if (error === undefined || error instanceof ResultNotStoredError || (error instanceof HookError && error.hook === 'onDone')) {
    // the record is completed: a result the codec refused or a hook's trouble does not undo it
    return { verdict: 'ack', delay: 0, error };
  }
  if (error instanceof ExhaustedError || error instanceof MismatchError || error instanceof MissingKeyError) return { verdict: 'dead-letter', delay: 0, error };
  if (error instanceof BusyError) return { verdict: 'hold', delay: Math.max(error.leaseLeft, MIN_DELAY), error };
  return { verdict: 'hold', delay: Math.max(retry, MIN_DELAY), error };
}

/** The error's text for a dead letter's header or field. */
export const errorText = (error: unknown): string => (error instanceof Error ? error.message : String(error));

/** An adapter's counters: the Idem's, and what the adapter did with the messages. */
export interface AdapterStats extends Stats {
  /** messages acknowledged as done (first runs and replays) */
  acknowledged: number;
  /** messages given back to come again (Busy, failures, the outcomes that are not acknowledged) */
  heldBack: number;
  /** messages moved to the dead letter and acknowledged */
  deadLettered: number;
}

/** The options every adapter takes for its loop, besides its own. */
export interface MessageOptions<M, T> {
  /** the message's key (each adapter has its default); undefined or '' is MissingKeyError: dead-lettered */
  key?: (message: M) => string | undefined;
  /** PAYLOAD from the message: a key seen again with another payload is dead-lettered (Mismatch) */
  payload?: (message: M) => Bytes;
  /** process()'s options for every message (lease, wait, maxTries, codec, ...): the Idem's where not set */
  process?: Omit<ProcessOptions<T>, 'payload'>;
  /** ms a failed message first waits before it comes again, doubling each time it fails again, at most 30 s (100) */
  retryDelay?: number;
  /** told what the adapter could not do (an acknowledgement, a dead letter, a commit); nothing by default */
  onError?: (error: unknown) => void;
}

/** One message through the Idem's loop: its key, its payload, its outcome or the error it ended with. */
export class MessageLoop<M, T> {
  readonly rt: Runtime;
  acknowledged = 0;
  heldBack = 0;
  deadLettered = 0;

  constructor(
    readonly idem: Idem,
    private readonly options: MessageOptions<M, T>,
    private readonly defaultKey: (message: M) => string | undefined,
    private readonly where: string,
  ) {
    this.rt = idemRuntime(idem);
    if (options.retryDelay !== undefined && !(options.retryDelay >= 0)) throw new RangeError(`retryDelay is in ms and must be >= 0 (got ${options.retryDelay})`);
  }

  /** The message's work through process(): its outcome, or the error it ended with (MissingKeyError without a key). */
  async run(message: M, work: (job: Job) => T | Promise<T>, ride?: Ride): Promise<{ outcome?: Outcome<T>; error?: unknown }> {
    let key: string | undefined;
    try {
      key = (this.options.key ?? this.defaultKey)(message);
    } catch (error) {
      return { error: new MissingKeyError(`the key function failed: ${errorText(error)}`, { cause: error }) };
    }
    if (typeof key !== 'string' || key === '') return { error: new MissingKeyError(`the message has no key (${this.where})`) };
    const payload = this.options.payload?.(message);
    const options = payload === undefined ? this.options.process : { ...this.options.process, payload };
    try {
      return { outcome: await process(this.rt, key, work, options, ride) };
    } catch (error) {
      return { error };
    }
  }

  /** What to do with the message; `failures` is how often it failed before (the retry delay doubles). */
  decide(error: unknown, failures = 0): Decision {
    return decide(error, backoff(this.options.retryDelay ?? DEFAULT_RETRY_DELAY, failures));
  }

  count(verdict: Verdict): void {
    if (verdict === 'ack') this.acknowledged++;
    else if (verdict === 'hold') this.heldBack++;
    else this.deadLettered++;
  }

  report(error: unknown): void {
    try {
      this.options.onError?.(error);
    } catch {
      // the adapter goes on
    }
  }

  get stats(): AdapterStats {
    return { ...this.rt.stats, acknowledged: this.acknowledged, heldBack: this.heldBack, deadLettered: this.deadLettered };
  }
}
