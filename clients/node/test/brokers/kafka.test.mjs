// redis-idem/kafka against a real Kafka (brokers/launch.py starts one for
// this file, on its own ports) and the module: what brokers/scenario.py does
// not look at one by one. Busy holds its partition back (neither run nor
// committed past, nothing after it run) while another partition goes on; a
// failure comes again before anything after it; Exhausted and a record
// without a key go to `<topic>-dlt` with Spring Kafka's headers, and then
// the partition is committed past them. Run by `make test-client-node-brokers`.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Kafka, logLevel } from 'kafkajs';
import { KafkaIdem } from '../../dist/esm/kafka.js';
import { connect, repo, startServer } from '../helpers.mjs';
import { until } from '../topology.mjs';

const launch = (...args) => execFileSync('python3', [join(repo, 'brokers/launch.py'), ...args], { encoding: 'utf8' });
let dir;
let server;
let kafka;
let admin;
let producer;
let n = 0;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'redis-idem-node-kafka-'));
  const broker = JSON.parse(launch('start', 'kafka', '--dir', dir).trim().split('\n').at(-1));
  server = await startServer();
  kafka = new Kafka({ clientId: 'kafka-test', brokers: [broker.bootstrap], logLevel: logLevel.NOTHING });
  admin = kafka.admin();
  producer = kafka.producer();
  await Promise.all([admin.connect(), producer.connect()]);
});
after(async () => {
  await producer?.disconnect();
  await admin?.disconnect();
  await server?.stop();
  if (dir) {
    launch('stop', '--dir', dir);
    rmSync(dir, { recursive: true, force: true });
  }
});

/** A topic (and its dead-letter topic) of `partitions`, `records` ([partition, key, value]) in it, an Idem and a member of a group on it. */
async function consume(partitions, records, handler, idemOptions = {}) {
  const topic = `t${++n}`;
  await admin.createTopics({ waitForLeaders: true, topics: [topic, `${topic}-dlt`].map((name) => ({ topic: name, numPartitions: partitions })) });
  await producer.send({ topic, acks: -1, messages: records.map(([partition, key, value]) => ({ partition, key, value })) });
  const idem = await connect('ioredis', server, { prefix: `${topic}:`, lease: 1000, ...idemOptions });
  const group = `${topic}-group`;
  const consumer = kafka.consumer({ groupId: group, sessionTimeout: 6000, heartbeatInterval: 500, maxWaitTimeInMs: 100 });
  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: true });
  const records_ = new KafkaIdem(idem, { producer });
  await consumer.run(records_.runConfig(handler));
  const committed = async () => {
    const [{ partitions: offsets }] = await admin.fetchOffsets({ groupId: group, topics: [topic] });
    return Object.fromEntries(offsets.map(({ partition, offset }) => [partition, Number(offset)]));
  };
  const stop = async () => {
    await consumer.disconnect();
    await idem.end();
  };
  return { topic, idem, records: records_, committed, stop };
}

test("Busy holds its partition back, nothing after it run or committed, until the holder's lease ends; the other partition goes on", async () => {
  const holder = await connect('ioredis', server, { prefix: `t${n + 1}:` });
  after(() => holder.end());
  assert.equal((await holder.claim('held', 6000)).status, 'NEW'); // longer than the group's first join
  const at = Date.now();
  const runs = [];
  const c = await consume(2, [[0, 'held', 'h'], [0, 'next', 'n'], [1, 'other', 'o']], ({ partition, message }, job) => {
    runs.push([partition, message.key.toString(), job.attempt, Date.now() - at]);
  }, { wait: 0 });
  await until('the other partition done while the first is held back', async () => c.records.stats.heldBack >= 1 && (await c.committed())[1] === 1);
  assert.deepEqual(runs.map(([p, key]) => [p, key]), [[1, 'other']]);
  assert.ok([-1, 0].includes((await c.committed())[0]), 'partition 0 not committed past the held record');
  await until('all done and committed', async () => c.records.stats.acknowledged === 3 && (await c.committed())[0] === 2);
  await c.stop();
  const first = runs.filter(([p]) => p === 0);
  assert.deepEqual(first.map(([, key, attempt]) => [key, attempt]), [['held', 2], ['next', 1]]); // the lapsed holder's was attempt 1
  assert.ok(first[0][3] >= 5900, `ran ${first[0][3]} ms after the holder's claim`);
});

test('a failure comes again before anything after it; Exhausted and a keyless record go to <topic>-dlt with their origin, then are committed', async () => {
  const runs = [];
  const c = await consume(1, [[0, 'flaky', 'f'], [0, 'poison', 'p'], [0, null, 'keyless'], [0, 'ok', 'k']], ({ message }, job) => {
    const key = message.key?.toString();
    runs.push([key, job.attempt]);
    if (key === 'poison' || (key === 'flaky' && job.attempt === 1)) throw new Error(`${key} broke`);
  }, { maxTries: 2 });
  await until('settled and committed', async () => c.records.stats.deadLettered === 2 && (await c.committed())[0] === 4);
  await c.stop();
  assert.deepEqual(runs, [['flaky', 1], ['flaky', 2], ['poison', 1], ['poison', 2], ['ok', 1]]);
  assert.equal(c.records.stats.acknowledged, 2);
  const letters = [];
  const reader = kafka.consumer({ groupId: `${c.topic}-dlt-reader`, maxWaitTimeInMs: 100 });
  await reader.connect();
  await reader.subscribe({ topics: [`${c.topic}-dlt`], fromBeginning: true });
  await reader.run({ eachMessage: async ({ partition, message }) => void letters.push({ partition, message }) });
  await until('the two dead letters read', () => letters.length === 2);
  await reader.disconnect();
  const header = (m, name) => m.headers[name]?.toString();
  assert.deepEqual(letters.map(({ message }) => message.value.toString()), ['p', 'keyless']);
  for (const [i, { partition, message }] of letters.entries()) {
    assert.equal(partition, 0);
    assert.equal(header(message, 'kafka_dlt-original-topic'), c.topic);
    assert.equal(header(message, 'kafka_dlt-original-partition'), '0');
    assert.equal(header(message, 'kafka_dlt-original-offset'), String(i + 1));
  }
  assert.match(header(letters[0].message, 'kafka_dlt-exception-message'), /poison broke|tries/);
  assert.match(header(letters[1].message, 'kafka_dlt-exception-message'), /no key|no record key/);
});

test("a record's dead letter is sent once: a next owner that reads the record again (its commit lost) finds the letter done", async () => {
  const c = await consume(1, [[0, 'poison', 'p'], [0, 'ok', 'k']], ({ message }) => {
    if (message.key?.toString() === 'poison') throw new Error('poison broke');
  }, { maxTries: 1 });
  await until('settled and committed', async () => c.records.stats.deadLettered === 1 && (await c.committed())[0] === 2);
  await c.stop();
  // another group from the topic's start, on the same records: as the partition's next owner after a lost commit
  const idem = await connect('ioredis', server, { prefix: `${c.topic}:`, lease: 1000, maxTries: 1 });
  const again = kafka.consumer({ groupId: `${c.topic}-again`, sessionTimeout: 6000, heartbeatInterval: 500, maxWaitTimeInMs: 100 });
  await again.connect();
  await again.subscribe({ topics: [c.topic], fromBeginning: true });
  const records = new KafkaIdem(idem, { producer });
  await again.run(records.runConfig(() => assert.fail('nothing runs again')));
  await until('the second group past both records', () => records.stats.deadLettered === 1 && records.stats.acknowledged === 1);
  await again.disconnect();
  assert.equal((await idem.get('kafka-dead-letter:' + c.topic + ':0:0'))?.state, 'done');
  await idem.end();
  const [{ high }] = await admin.fetchTopicOffsets(`${c.topic}-dlt`);
  assert.equal(high, '1', 'one dead letter in the topic');
});
