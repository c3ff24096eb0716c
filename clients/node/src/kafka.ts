// redis-idem/kafka: kafkajs's `eachBatch`, each record run through the Idem's
// loop (docs/clients.md, "Consumers of brokers"). `runConfig()` is what
// `consumer.run()` takes. Why eachBatch with eachBatchAutoResolve off: in
// kafkajs the resolved offset of a partition is both what is committed and
// where its next fetch starts, and eachMessage resolves every record that
// returns, a held-back one too. Here
// - a record's offset is resolved only once it is done (or a replay, or its
//   dead letter is written), in the partition's order: what kafkajs commits
//   (at each batch's end, and when a rebalance is learned from a heartbeat,
//   before the partition goes) never passes a record not done;
// - Busy and failures: the batch ends there unresolved and the partition is
//   paused for the delay (the holder's lease left, or retryDelay doubling);
//   its next fetch starts at that record, the other partitions go on;
// - Exhausted, Mismatch and no key: the record to `<topic>-dlt`, same
//   partition, headers kafka_dlt-original-topic / -partition / -offset and
//   kafka_dlt-exception-message (as Spring Kafka names them), then resolved;
//   the send runs through the Idem under `kafka-dead-letter:<topic>:<partition>:<offset>`
//   (as the Java adapter does): a next owner that reads the record again
//   because its commit was lost finds that letter done and sends none;
// - long work: kafkajs's heartbeat is sent while the work runs (kafkajs has
//   no heartbeat of its own between fetches), so the group keeps the member;
//   a rebalance it answers ends the batch after the record in hand.
// kafkajs is not imported: the types below are the parts of it used here.
import { type Job, newStats } from './core.js';
import { json } from './codec.js';
import { type Idem, idemRuntime } from './idem.js';
import { type Runtime, process } from './loop.js';
import { type AdapterStats, type MessageOptions, MessageLoop, errorText } from './broker.js';

/** A record, as kafkajs's KafkaMessage. */
export interface KafkaRecord {
  key: Buffer | null;
  value: Buffer | null;
  offset: string;
  headers?: Record<string, unknown>;
  [field: string]: unknown;
}

/** One record and where it is from: what the handler and the key function get. */
export interface KafkaRecordPayload {
  topic: string;
  partition: number;
  message: KafkaRecord;
}

/** The parts of kafkajs's EachBatchPayload the adapter uses. */
export interface EachBatchPayload {
  batch: { topic: string; partition: number; messages: KafkaRecord[] };
  resolveOffset(offset: string): void;
  heartbeat(): Promise<void>;
  pause(): () => void;
  commitOffsetsIfNecessary(offsets?: unknown): Promise<void>;
  uncommittedOffsets(): unknown;
  isRunning(): boolean;
  isStale(): boolean;
}

/** The parts of a kafkajs Producer the adapter uses (for the dead letters). */
export interface KafkaProducerLike {
  send(record: { topic: string; acks?: number; messages: { key: Buffer | null; value: Buffer | null; partition: number; headers: Record<string, unknown> }[] }): Promise<unknown>;
}

export type KafkaHandler<T> = (record: KafkaRecordPayload, job: Job) => T | Promise<T>;

export interface KafkaIdemOptions<T> extends MessageOptions<KafkaRecordPayload, T> {
  /** sends the dead letters (connected); required */
  producer: KafkaProducerLike;
  /** the dead-letter topic of a topic (`<topic>-dlt`) */
  deadLetterTopic?: (topic: string) => string;
  /** ms between asking kafkajs for a heartbeat while a work runs (250; kafkajs sends one each heartbeatInterval at most) */
  heartbeatEvery?: number;
}

/** kafkajs's own consumer.run() options, passed on (partitionsConsumedConcurrently, autoCommitInterval, ...). */
export interface KafkaRunOptions {
  partitionsConsumedConcurrently?: number;
  [option: string]: unknown;
}

/** What runConfig() answers: kafkajs's options and the adapter's eachBatch. */
export type KafkaRunConfig = KafkaRunOptions & { autoCommit: true; eachBatchAutoResolve: false; eachBatch: (payload: EachBatchPayload) => Promise<void> };

/** The key the records are claimed with by default: the record's key, as UTF-8. */
export const recordKey = ({ message }: KafkaRecordPayload): string | undefined => message.key?.toString('utf8');

export class KafkaIdem<T = unknown> {
  readonly #loop: MessageLoop<KafkaRecordPayload, T>;
  readonly #producer: KafkaProducerLike;
  /** the Idem's parts for the dead letters' sends: no try limit nor filter, JSON, own counters, no hooks */
  readonly #letters: Runtime;
  readonly #deadLetterTopic: (topic: string) => string;
  readonly #heartbeatEvery: number;
  /** per partition, the record held back last and how often it failed in a row (its delay doubles) */
  readonly #failures = new Map<string, { offset: string; count: number }>();

  constructor(idem: Idem, options: KafkaIdemOptions<T>) {
    if (!options?.producer) throw new TypeError('redis-idem/kafka: options.producer (connected) sends the dead letters');
    this.#loop = new MessageLoop(idem, options, recordKey, 'no record key');
    this.#producer = options.producer;
    const rt = idemRuntime(idem);
    this.#letters = { ...rt, stats: newStats(), hooks: {}, settings: { ...rt.settings, maxTries: undefined, bloom: undefined, codec: json } };
    this.#deadLetterTopic = options.deadLetterTopic ?? ((topic) => `${topic}-dlt`);
    this.#heartbeatEvery = Math.max(50, options.heartbeatEvery ?? 250);
  }

  /** The Idem's counters and the adapter's: records acknowledged (resolved), held back, dead-lettered. */
  get stats(): AdapterStats {
    return this.#loop.stats;
  }

  /**
   * consumer.run()'s options: `eachBatch` running `handler` through the loop
   * for each record, in order, and kafkajs's `options` (autoCommit stays on
   * and eachBatchAutoResolve off: the adapter resolves what is done).
   */
  runConfig(handler: KafkaHandler<T>, options: KafkaRunOptions = {}): KafkaRunConfig {
    return { ...options, autoCommit: true, eachBatchAutoResolve: false, eachBatch: (payload) => this.#batch(payload, handler) };
  }

  async #batch(payload: EachBatchPayload, handler: KafkaHandler<T>): Promise<void> {
    const { topic, partition, messages } = payload.batch;
    let resolved = false;
    try {
      for (const message of messages) {
        if (!payload.isRunning() || payload.isStale()) break;
        const settled = await this.#one(payload, { topic, partition, message }, handler);
        if (!settled) break; // held back: nothing after it before it
        payload.resolveOffset(message.offset);
        resolved = true;
        // a rebalance under way throws here (kafkajs commits what is resolved, then rejoins)
        await payload.heartbeat();
      }
    } finally {
      // what is done is committed now: a member that goes idle or stops leaves nothing resolved behind
      if (resolved) await payload.commitOffsetsIfNecessary(payload.uncommittedOffsets());
    }
  }

  /** One record through the loop; true once it is done or dead-lettered (resolvable), false when held back. */
  async #one(payload: EachBatchPayload, record: KafkaRecordPayload, handler: KafkaHandler<T>): Promise<boolean> {
    const loop = this.#loop;
    const { topic, partition, message } = record;
    const where = `${topic}/${partition}`;
    // kafkajs sends a heartbeat only when asked (and at most each heartbeatInterval)
    const beat = setInterval(() => payload.heartbeat().catch(() => undefined), this.#heartbeatEvery);
    let error: unknown;
    try {
      ({ error } = await loop.run(record, (job) => handler(record, job)));
    } finally {
      clearInterval(beat);
    }
    const last = this.#failures.get(where);
    const failures = last?.offset === message.offset ? last.count : 0;
    let decision = loop.decide(error, failures);
    if (decision.verdict === 'dead-letter') {
      try {
        await this.#deadLetter(record, decision.error);
      } catch (err) {
        loop.report(err); // not written: held back, to be tried again
        decision = { verdict: 'hold', delay: loop.decide(err, failures).delay, error: err };
      }
    }
    if (decision.verdict === 'hold') {
      this.#failures.set(where, { offset: message.offset, count: failures + 1 });
      const resume = payload.pause();
      setTimeout(resume, decision.delay).unref?.();
      loop.count('hold');
      return false;
    }
    this.#failures.delete(where);
    loop.count(decision.verdict);
    return true;
  }

  async #deadLetter({ topic, partition, message }: KafkaRecordPayload, error: unknown): Promise<void> {
    const headers = {
      ...message.headers,
      'kafka_dlt-original-topic': topic,
      'kafka_dlt-original-partition': String(partition),
      'kafka_dlt-original-offset': message.offset,
      'kafka_dlt-exception-message': errorText(error),
    };
    const send = { topic: this.#deadLetterTopic(topic), acks: -1, messages: [{ key: message.key, value: message.value, partition, headers }] };
    await process(this.#letters, `kafka-dead-letter:${topic}:${partition}:${message.offset}`, async () => {
      await this.#producer.send(send);
      return null;
    });
  }
}
