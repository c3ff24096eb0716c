// The Node adapters' consumer program for brokers/scenario.py
// (brokers/README.md, "Writing a consumer program"): node-streams,
// node-amqp and node-kafka, each written as clients/node/README.md shows,
// configured from the environment the scenario gives. The records' client is ioredis on the
// module and node-redis on the Functions edition, so that the scenario runs
// each adapter over both clients.
import { setTimeout as sleep } from 'node:timers/promises';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { Idem } from 'redis-idem';
import { StreamConsumer } from 'redis-idem/streams';
import { AmqpConsumer } from 'redis-idem/amqp';
import { KafkaIdem } from 'redis-idem/kafka';
import { connect } from 'amqplib';
import { Kafka, logLevel } from 'kafkajs';

const env = process.env;
const MEMBER = env.IDEM_MEMBER;

// The work: its start and its effect, fenced by the attempt, in the side store.
const side = new Redis(env.SIDE_REDIS_URL);

async function work(body, job) {
  if ((await side.evalsha(env.SIDE_START_SHA, 1, body.key, body.kind, MEMBER)) === 'fail') throw new Error(`${body.key}: the work failed`);
  await sleep(Number(body.kind === 'slow' ? env.IDEM_SLOW_WORK_MS : env.IDEM_WORK_MS));
  job.check(); // a member stopped past its lease learns it here, before its effect
  await side.evalsha(env.SIDE_EFFECT_SHA, 1, body.key, job.attempt, body.account, body.seq, MEMBER);
  return { n: body.seq };
}

async function records() {
  if (env.IDEM_EDITION === 'module') return new Redis(env.IDEM_REDIS_URL);
  const client = createClient({ url: env.IDEM_REDIS_URL });
  client.on('error', () => undefined);
  return client.connect();
}

// Each takes one message at a time: the scenario watches what each member works on.
async function streams(idem) {
  const consumer = new StreamConsumer(idem, { stream: env.IDEM_SOURCE, group: env.IDEM_GROUP, consumer: `member-${MEMBER}`, concurrency: 1 });
  process.once('SIGTERM', () => void consumer.stop());
  await consumer.run((entry, job) => work(JSON.parse(entry.fields.body), job));
}

async function amqp(idem) {
  const connection = await connect(JSON.parse(env.BROKER).url);
  const channel = await connection.createConfirmChannel();
  await channel.prefetch(1);
  const consumer = new AmqpConsumer(idem, channel, env.IDEM_SOURCE);
  process.once('SIGTERM', () => void consumer.stop());
  await consumer.run((message, job) => work(JSON.parse(message.content), job));
  await connection.close();
}

async function kafka(idem) {
  const kafka = new Kafka({ clientId: `member-${MEMBER}`, brokers: [JSON.parse(env.BROKER).bootstrap], logLevel: logLevel.ERROR });
  // The session no longer than the lease (as the Python program's): a member stopped past its lease has lost its partitions too.
  const lease = Number(env.IDEM_LEASE_S) * 1000;
  const consumer = kafka.consumer({ groupId: env.IDEM_GROUP, sessionTimeout: lease, heartbeatInterval: lease / 4, maxWaitTimeInMs: 100 });
  const producer = kafka.producer();
  await Promise.all([consumer.connect(), producer.connect()]);
  await consumer.subscribe({ topics: [env.IDEM_SOURCE], fromBeginning: true });
  const records = new KafkaIdem(idem, { producer });
  // kafkajs restarts a crashed consumer itself (its STOP event comes then too): the program ends on SIGTERM alone.
  consumer.on(consumer.events.CRASH, ({ payload }) => payload.restart || process.exit(1));
  const stopped = new Promise((resolve) => process.once('SIGTERM', () => consumer.disconnect().then(resolve, resolve)));
  await consumer.run(records.runConfig(({ message }, job) => work(JSON.parse(message.value), job)));
  await stopped;
  await producer.disconnect();
}

const adapters = { 'node-streams': streams, 'node-amqp': amqp, 'node-kafka': kafka };
const run = adapters[env.IDEM_ADAPTER];
if (!run) throw new Error(`consumer.mjs: no adapter ${env.IDEM_ADAPTER}`);
const client = await records();
const idem = new Idem(client, { lease: Number(env.IDEM_LEASE_S) * 1000, maxTries: Number(env.IDEM_MAX_TRIES) });
await run(idem);
await idem.close();
await (client.quit?.() ?? client.close());
side.disconnect();
