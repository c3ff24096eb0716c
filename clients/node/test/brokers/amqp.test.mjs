// redis-idem/amqp against a real RabbitMQ (brokers/launch.py starts one for
// this file, on its own ports) and the module: what brokers/scenario.py does
// not look at one by one. Busy is given back through a retry queue, neither
// run nor acknowledged until the holder's lease ends, the copy keeping its
// message_id and counting its retries; a failure comes again; Exhausted and
// a message without a message_id go to the queue's dead-letter exchange
// (x-death says where from). Run by `make test-client-node-brokers`.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { connect as amqpConnect } from 'amqplib';
import { AmqpConsumer } from '../../dist/esm/amqp.js';
import { connect, repo, startServer } from '../helpers.mjs';
import { until } from '../topology.mjs';

const launch = (...args) => execFileSync('python3', [join(repo, 'brokers/launch.py'), ...args], { encoding: 'utf8' });
let dir;
let broker;
let server;
let connection;
let admin;
let n = 0;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'redis-idem-node-rabbitmq-'));
  broker = JSON.parse(launch('start', 'rabbitmq', '--dir', dir).trim().split('\n').at(-1));
  server = await startServer();
  connection = await amqpConnect(broker.url);
  admin = await connection.createChannel();
});
after(async () => {
  await connection?.close();
  await server?.stop();
  if (dir) {
    launch('stop', '--dir', dir);
    rmSync(dir, { recursive: true, force: true });
  }
});


/** A quorum queue with its dead-letter exchange and queue (as the scenario's), the messages in it, an Idem and a consumer on it. */
async function consume(messages, handler, idemOptions = {}) {
  const q = `q${++n}`;
  await admin.assertExchange(`${q}.dlx`, 'fanout', { durable: true });
  await admin.assertQueue(`${q}.dlq`, { durable: true });
  await admin.bindQueue(`${q}.dlq`, `${q}.dlx`, '');
  await admin.assertQueue(q, { durable: true, arguments: { 'x-queue-type': 'quorum', 'x-dead-letter-exchange': `${q}.dlx`, 'x-delivery-limit': 20 } });
  for (const [messageId, body] of messages) admin.sendToQueue(q, Buffer.from(body), messageId ? { messageId } : {});
  const idem = await connect('ioredis', server, { prefix: `${q}:`, lease: 1000, ...idemOptions });
  const channel = await connection.createConfirmChannel();
  await channel.prefetch(4);
  const consumer = new AmqpConsumer(idem, channel, q);
  const running = consumer.run(handler);
  const count = async (name) => (await admin.checkQueue(name)).messageCount;
  const dead = async () => {
    const out = [];
    for (let m; (m = await admin.get(`${q}.dlq`, { noAck: true })); ) out.push(m);
    return out;
  };
  const stop = async () => {
    await consumer.stop();
    await running;
    await channel.close();
    await idem.end();
  };
  return { q, idem, consumer, count, dead, stop };
}

test("Busy is given back through a retry queue, neither run nor acknowledged until the holder's lease ends", async () => {
  const holder = await connect('ioredis', server, { prefix: `q${n + 1}:` });
  assert.equal((await holder.claim('held', 1000)).status, 'NEW');
  const at = Date.now();
  const runs = [];
  const c = await consume([['held', 'x']], (message, job) => runs.push([message.properties.messageId, message.properties.headers['x-idem-retries'], job.attempt, Date.now() - at]), { wait: 0 });
  await until('it was held back', () => c.consumer.stats.heldBack >= 1);
  assert.deepEqual(runs, []);
  await until('it ran', () => c.consumer.stats.acknowledged === 1);
  await c.stop();
  await holder.end();
  assert.equal(runs.length, 1);
  const [messageId, retries, attempt, after] = runs[0];
  assert.deepEqual([messageId, retries, attempt], ['held', 1, 2]); // the lapsed holder's was attempt 1
  assert.ok(after >= 900, `ran ${after} ms after the holder's claim`);
  assert.equal(c.consumer.stats.heldBack, 1);
  assert.equal(await c.count(c.q), 0);
});

test('a failure comes again; Exhausted and a message without message_id go to the dead-letter exchange', async () => {
  const attempts = { flaky: [], poison: [] };
  const c = await consume([['flaky', 'f'], ['poison', 'p'], [undefined, 'keyless']], (message, job) => {
    const key = message.properties.messageId;
    attempts[key].push(job.attempt);
    if (key === 'poison' || job.attempt === 1) throw new Error(`${key} broke`);
  }, { maxTries: 2 });
  await until('settled', () => c.consumer.stats.deadLettered === 2 && c.consumer.stats.acknowledged === 1);
  assert.equal((await c.idem.get('flaky')).state, 'done');
  await c.stop();
  assert.deepEqual(attempts, { flaky: [1, 2], poison: [1, 2] });
  // A reject is not confirmed: the quorum queue dead-letters it a moment later.
  await until('both dead letters queued', async () => (await c.count(`${c.q}.dlq`)) === 2);
  const letters = await c.dead();
  assert.deepEqual(letters.map((m) => m.content.toString()).sort(), ['keyless', 'p']);
  for (const m of letters) assert.equal(m.properties.headers['x-death'][0].queue, c.q);
  assert.equal(await c.count(c.q), 0);
});
