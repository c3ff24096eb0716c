// redis-idem/amqp: an amqplib consumer whose deliveries each run through the
// Idem's loop (docs/clients.md, "Consumers of brokers"):
// - acknowledged (basic.ack) only once the record is done, or a replay;
// - Busy and failures given back through a retry queue `<queue>.retry.<ms>`
//   (its TTL a power of two at least the delay, dead-lettering back to the
//   queue): the copy is confirmed by the broker before the delivery is
//   acknowledged, so nothing is lost in between, and it counts its retries
//   (header x-idem-retries) for the delay's doubling;
// - Exhausted, Mismatch and no key rejected without requeue: the queue's
//   own dead-letter exchange takes it, x-death saying where it came from.
// The channel must be a confirm channel (connection.createConfirmChannel()).
// amqplib is not imported: the types below are the parts of it used here.
import type { Job } from './core.js';
import type { Idem } from './idem.js';
import { type AdapterStats, type MessageOptions, MessageLoop, errorText } from './broker.js';

/** A delivery, as amqplib's ConsumeMessage. */
export interface AmqpMessage {
  content: Buffer;
  fields: { deliveryTag: number; redelivered: boolean; exchange: string; routingKey: string };
  properties: { messageId?: string; headers?: Record<string, unknown>; [property: string]: unknown };
}

/** The parts of amqplib's ConfirmChannel the consumer uses. */
export interface AmqpChannel {
  consume(queue: string, onMessage: (message: AmqpMessage | null) => void, options?: { noAck?: boolean }): Promise<{ consumerTag: string }>;
  cancel(consumerTag: string): Promise<unknown>;
  ack(message: AmqpMessage): void;
  nack(message: AmqpMessage, allUpTo?: boolean, requeue?: boolean): void;
  assertQueue(queue: string, options?: Record<string, unknown>): Promise<unknown>;
  sendToQueue(queue: string, content: Buffer, options: Record<string, unknown>, callback?: (err: unknown) => void): boolean;
}

export type AmqpHandler<T> = (message: AmqpMessage, job: Job) => T | Promise<T>;

export interface AmqpConsumerOptions<T> extends MessageOptions<AmqpMessage, T> {
  /** the retry queues' name before `.<ms>` (`<queue>.retry`) */
  retryQueue?: string;
}

/** The header a given-back copy counts its retries in. */
export const RETRIES_HEADER = 'x-idem-retries';
/** A retry queue's TTL: the least power of two >= the delay, from 128 ms to 32768 ms. */
const bucket = (delay: number) => 2 ** Math.min(15, Math.max(7, Math.ceil(Math.log2(Math.max(1, delay)))));

export class AmqpConsumer<T = unknown> {
  readonly #loop: MessageLoop<AmqpMessage, T>;
  readonly #retryQueue: string;
  readonly #declared = new Map<number, Promise<unknown>>();
  readonly #inHand = new Set<Promise<void>>();
  #tag: string | undefined;
  #ended: (() => void) | undefined;

  constructor(
    idem: Idem,
    private readonly channel: AmqpChannel,
    private readonly queue: string,
    options: AmqpConsumerOptions<T> = {},
  ) {
    if (typeof queue !== 'string' || queue === '') throw new TypeError('redis-idem/amqp: the queue is required');
    this.#loop = new MessageLoop(idem, options, (message) => message.properties.messageId, 'no message_id');
    this.#retryQueue = options.retryQueue ?? `${queue}.retry`;
  }

  /** The Idem's counters and the consumer's: messages acknowledged, held back (given back), dead-lettered. */
  get stats(): AdapterStats {
    return this.#loop.stats;
  }

  /** Consumes until stop(); resolves once the deliveries in hand are settled. */
  async run(handler: AmqpHandler<T>): Promise<void> {
    if (this.#tag !== undefined) throw new Error('redis-idem/amqp: run() is already running');
    const ended = new Promise<void>((resolve) => (this.#ended = resolve));
    const { consumerTag } = await this.channel.consume(this.queue, (message) => {
      if (message === null) {
        this.#ended?.(); // the broker cancelled the consumer (the queue was deleted)
        return;
      }
      const handled = this.#handle(message, handler).finally(() => this.#inHand.delete(handled));
      this.#inHand.add(handled);
    });
    this.#tag = consumerTag;
    await ended;
    while (this.#inHand.size) await Promise.all(this.#inHand);
    this.#tag = undefined;
  }

  /** Takes no new delivery (basic.cancel); resolves when run() has ended. */
  async stop(): Promise<void> {
    if (this.#tag !== undefined) {
      try {
        await this.channel.cancel(this.#tag);
      } catch (err) {
        this.#loop.report(err);
      }
    }
    this.#ended?.();
    while (this.#inHand.size) await Promise.all(this.#inHand);
  }

  async #handle(message: AmqpMessage, handler: AmqpHandler<T>): Promise<void> {
    const loop = this.#loop;
    const { error } = await loop.run(message, (job) => handler(message, job));
    const retries = Number(message.properties.headers?.[RETRIES_HEADER] ?? 0) || 0;
    const decision = loop.decide(error, retries);
    try {
      if (decision.verdict === 'ack') {
        this.channel.ack(message);
      } else if (decision.verdict === 'dead-letter') {
        loop.report(decision.error); // its error: x-death carries where it came from, not why
        this.channel.nack(message, false, false);
      } else {
        await this.#giveBack(message, decision.delay, retries);
        this.channel.ack(message);
      }
      loop.count(decision.verdict);
    } catch (err) {
      // the copy was not confirmed: back in the queue now (the quorum queue's delivery-limit counts it)
      loop.report(err);
      try {
        this.channel.nack(message, false, true);
      } catch (again) {
        loop.report(again); // a closed channel: the broker requeues what it had not acknowledged
      }
    }
  }

  /** A copy into the retry queue whose TTL covers `delay`, confirmed by the broker. */
  async #giveBack(message: AmqpMessage, delay: number, retries: number): Promise<void> {
    const ttl = bucket(delay);
    const name = `${this.#retryQueue}.${ttl}`;
    let declared = this.#declared.get(ttl);
    if (!declared) {
      declared = this.channel.assertQueue(name, { durable: true, messageTtl: ttl, deadLetterExchange: '', deadLetterRoutingKey: this.queue });
      declared.catch(() => this.#declared.delete(ttl));
      this.#declared.set(ttl, declared);
    }
    await declared;
    const { headers, ...properties } = message.properties;
    const copy = { ...properties, headers: { ...headers, [RETRIES_HEADER]: retries + 1 }, persistent: true };
    await new Promise<void>((resolve, reject) => {
      this.channel.sendToQueue(name, message.content, copy, (err) => (err ? reject(err instanceof Error ? err : new Error(errorText(err))) : resolve()));
    });
  }
}
