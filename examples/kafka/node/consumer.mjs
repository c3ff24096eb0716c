// Orders from a Kafka topic, each charged once however often it is
// delivered (redis-idem/kafka over kafkajs). Needs a Redis with the
// redis-idem module (or functions/idem.lua loaded) and a Kafka broker
// (`python3 brokers/launch.py start kafka --dir /tmp/kafka` starts one and
// prints its address). `npm install` here, then:
//
//     node consumer.mjs produce    # 5 orders, the third one twice
//     node consumer.mjs            # charge them; Ctrl-C to stop
//
// REDIS_URL and KAFKA (bootstrap servers) pick the servers.
import { Redis } from 'ioredis';
import { Kafka, logLevel } from 'kafkajs';
import { Idem } from 'redis-idem';
import { KafkaIdem } from 'redis-idem/kafka';

const kafka = new Kafka({ brokers: (process.env.KAFKA ?? 'localhost:9092').split(','), logLevel: logLevel.ERROR });
const producer = kafka.producer();
await producer.connect();

if (process.argv[2] === 'produce') {
  // a producer's retry: order 3 again, a new offset
  const messages = [1, 2, 3, 3, 4, 5].map((n) => ({ key: `order:${n}`, value: JSON.stringify({ id: n, cents: 100 * n }) }));
  await producer.send({ topic: 'orders', messages });
  await producer.disconnect();
  process.exit(0);
}

const redis = new Redis(process.env.REDIS_URL ?? 'redis://localhost:6379');
const idem = new Idem(redis, { lease: 30000, maxTries: 5 });
const consumer = kafka.consumer({ groupId: 'billing', sessionTimeout: 30000 });
await consumer.connect();
await consumer.subscribe({ topics: ['orders'], fromBeginning: true });
const records = new KafkaIdem(idem, { producer, onError: (err) => console.error('not done:', err) });

async function charge({ partition, message }, job) {
  const order = JSON.parse(message.value);
  console.log(`charging order ${order.id}: ${order.cents} cents (partition ${partition}, offset ${message.offset}, attempt ${job.attempt})`);
  return { charged: order.cents }; // stored by IDEM.DONE; a duplicate replays it
}

const stop = async () => {
  await consumer.disconnect(); // ends the batches after their record, commits what is done, leaves the group
  await producer.disconnect();
  console.log(records.stats);
  await idem.close();
  redis.disconnect();
};
process.once('SIGINT', stop);
process.once('SIGTERM', stop);
await consumer.run(records.runConfig(charge));
