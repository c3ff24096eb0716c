// The Express Idempotency-Key middleware through a real HTTP server and
// real fetch: the first request runs, a repeat replays the stored status,
// headers and body; a repeat in flight waits for it, or gets 409 with
// Retry-After when it is still at work after the wait; a reused key with
// another body gets 422; a 5xx releases the key so a retry runs again.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, test } from 'node:test';
import express from 'express';
import { idempotency, keepRawBody } from '../dist/esm/index.js';
import { connect, signal, startServer } from './helpers.mjs';

let server;
let http;
let base;
let idem;
let runs = 0;
let gate = null; // while set, /slow waits on it
const handlerStarted = [];
let failNext = 0;
let durableIdem;
let useDurable = false;

before(async () => {
  server = await startServer();
  idem = await connect('ioredis', server, { prefix: 'express:' });
  const app = express();
  app.use(express.json({ verify: keepRawBody }));
  app.post('/orders', idempotency(idem, { wait: 3000 }), (req, res) => {
    runs++;
    res.status(201).set('x-order', `o-${runs}`).json({ order: runs, attempt: res.locals.idempotency?.attempt ?? 0, item: req.body.item });
  });
  app.post('/slow', idempotency(idem, { wait: 200 }), async (req, res) => {
    runs++;
    handlerStarted.forEach((s) => s.resolve());
    if (gate) await gate.promise;
    res.status(200).send(`slow ${runs}`);
  });
  // before any body parser: the middleware reads the raw body itself
  app.post('/raw', idempotency(idem), (req, res) => {
    runs++;
    res.status(201).send(`raw ${req.rawBody.toString()}`);
  });
  app.post('/flaky', idempotency(idem), (req, res) => {
    runs++;
    if (failNext-- > 0) return res.status(503).send('try again');
    res.status(200).send(`flaky ok, attempt ${res.locals.idempotency.attempt}`);
  });
  // one route, two Idems on the same records: the plain one stores, the durable one (1 replica asked, none here) replays
  durableIdem = await connect('ioredis', server, { prefix: 'express:', durable: { replicas: 1, timeout: 50 } });
  const plainMw = idempotency(idem);
  const durableMw = idempotency(durableIdem);
  app.post('/durable', (req, res, next) => (useDurable ? durableMw : plainMw)(req, res, next), (req, res) => {
    runs++;
    res.status(201).set('x-order', `o-${runs}`).send(`durable ${runs}`);
  });
  http = app.listen(0, '127.0.0.1');
  await once(http, 'listening');
  base = `http://127.0.0.1:${http.address().port}`;
});
after(async () => {
  http.close();
  await idem.end();
  await durableIdem.end();
  await server.stop();
});

const post = (path, key, body) =>
  fetch(base + path, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { 'idempotency-key': key } : {}) },
    body: JSON.stringify(body),
  });

test('the first request runs; a repeat replays its status, headers and body', async () => {
  runs = 0;
  const first = await post('/orders', 'k1', { item: 'book' });
  assert.equal(first.status, 201);
  assert.equal(first.headers.get('x-order'), 'o-1');
  assert.equal(first.headers.get('idempotent-replayed'), null);
  assert.deepEqual(await first.json(), { order: 1, attempt: 1, item: 'book' });
  const repeat = await post('/orders', 'k1', { item: 'book' });
  assert.equal(repeat.status, 201);
  assert.equal(repeat.headers.get('x-order'), 'o-1');
  assert.equal(repeat.headers.get('idempotent-replayed'), 'true');
  assert.match(repeat.headers.get('content-type'), /application\/json/);
  assert.deepEqual(await repeat.json(), { order: 1, attempt: 1, item: 'book' });
  assert.equal(runs, 1);
  // without the header, the request simply runs
  assert.equal((await post('/orders', null, { item: 'pen' })).status, 201);
  assert.equal(runs, 2);
});

test('the same key with another body answers 422', async () => {
  await post('/orders', 'k2', { item: 'book' });
  const reused = await post('/orders', 'k2', { item: 'car' });
  assert.equal(reused.status, 422);
  assert.match(await reused.text(), /reused/);
});

test('a repeat in flight waits for the first and gets its response; past the wait, 409 with Retry-After', async () => {
  runs = 0;
  gate = signal();
  const started = signal();
  handlerStarted.push(started);
  const first = post('/slow', 'k3', {});
  await started.promise;
  handlerStarted.length = 0;
  const busy = await post('/slow', 'k3', {}); // waitMs 200: still at work
  assert.equal(busy.status, 409);
  assert.equal(busy.headers.get('retry-after'), '1');
  const waiting = post('/slow', 'k3', {});
  setTimeout(() => gate.resolve(), 50); // finishes within the duplicate's wait
  const [a, b] = await Promise.all([first, waiting]);
  gate = null;
  assert.equal(a.status, 200);
  assert.equal(await a.text(), 'slow 1');
  assert.equal(b.status, 200);
  assert.equal(await b.text(), 'slow 1');
  assert.equal(b.headers.get('idempotent-replayed'), 'true');
  assert.equal(runs, 1);
});

test('a 5xx is not stored: the key is released and a retry runs again, as a later attempt', async () => {
  runs = 0;
  failNext = 1;
  const failed = await post('/flaky', 'k4', {});
  assert.equal(failed.status, 503);
  assert.equal((await idem.get('http:k4')).state, 'released');
  const retried = await post('/flaky', 'k4', {});
  assert.equal(retried.status, 200);
  assert.equal(await retried.text(), 'flaky ok, attempt 2');
  const replay = await post('/flaky', 'k4', {});
  assert.equal(await replay.text(), 'flaky ok, attempt 2');
  assert.equal(runs, 2);
});

test('after maxTries failed attempts the key answers 500 for good', async () => {
  failNext = 3;
  for (let i = 0; i < 3; i++) assert.equal((await post('/flaky', 'k5', {})).status, 503);
  const spent = await post('/flaky', 'k5', {});
  assert.equal(spent.status, 500);
  assert.match(await spent.text(), /failed 3 times/);
  failNext = 0;
});

test('the stored response is the shared JSON format; the middleware reads a raw body itself before any parser', async () => {
  runs = 0;
  const first = await fetch(base + '/raw', { method: 'POST', headers: { 'idempotency-key': 'k6' }, body: 'a b' });
  assert.equal(first.status, 201);
  assert.equal(await first.text(), 'raw a b');
  const record = await idem.get('http:k6');
  const stored = JSON.parse(record.result.toString());
  assert.equal(stored.v, 1);
  assert.equal(stored.status, 201);
  assert.equal(Buffer.from(stored.body, 'base64').toString(), 'raw a b');
  assert.ok(stored.headers.every(([name]) => !['date', 'content-length', 'connection', 'keep-alive', 'transfer-encoding'].includes(name)));
  const repeat = await fetch(base + '/raw', { method: 'POST', headers: { 'idempotency-key': 'k6' }, body: 'a b' });
  assert.equal(await repeat.text(), 'raw a b');
  assert.equal(repeat.headers.get('idempotent-replayed'), 'true');
  assert.equal((await fetch(base + '/raw', { method: 'POST', headers: { 'idempotency-key': 'k6' }, body: 'a  b' })).status, 422);
  assert.equal(runs, 1);
});

test('the key is taken without surrounding spaces and tabs (a framework or proxy that leaves them), as every library takes it', async () => {
  const app = express();
  app.use((req, res, next) => {
    req.headers['idempotency-key'] = ` \t${req.headers['x-raw-key']}\t `; // Node's own parser trims; others may not
    next();
  });
  app.use(express.json({ verify: keepRawBody }));
  let handled = 0;
  app.post('/ows', idempotency(idem), (req, res) => res.status(201).send(`ows ${++handled}`));
  const server = app.listen(0, '127.0.0.1');
  await once(server, 'listening');
  try {
    const url = `http://127.0.0.1:${server.address().port}/ows`;
    const first = await fetch(url, { method: 'POST', headers: { 'x-raw-key': 'k8' } });
    assert.equal(await first.text(), 'ows 1');
    assert.equal((await idem.get('http:k8')).state, 'done');
    assert.equal(await idem.get('http: \tk8\t '), null);
  } finally {
    server.closeAllConnections();
    server.close();
  }
});

test("the middleware takes the Idem's wait and maxTries unless its own options set them", async () => {
  const strict = await connect('ioredis', server, { prefix: 'express-idem:', wait: 300, maxTries: 1 });
  const app = express();
  app.use(express.json({ verify: keepRawBody }));
  let release;
  let fail = true;
  app.post('/held', idempotency(strict), async (req, res) => {
    if (req.body.hold) await new Promise((r) => (release = r));
    if (fail) return res.status(503).send('down');
    res.status(200).send('held done');
  });
  const listening = app.listen(0, '127.0.0.1');
  await once(listening, 'listening');
  const url = `http://127.0.0.1:${listening.address().port}/held`;
  const send = (key, body) => fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', 'idempotency-key': key }, body: JSON.stringify(body) });
  try {
    // maxTries 1 from the Idem: one failure spends the key (the middleware's own default is 3)
    assert.equal((await send('m1', {})).status, 503);
    assert.equal((await send('m1', {})).status, 500);
    // wait 300 ms from the Idem: a repeat in flight is 409 after it (the middleware's own default waits 10 s)
    fail = false;
    const first = send('m2', { hold: true });
    while (!release) await new Promise((r) => setTimeout(r, 10));
    const started = Date.now();
    const repeat = await send('m2', { hold: true });
    assert.equal(repeat.status, 409);
    assert.ok(Date.now() - started < 3000, `waited ${Date.now() - started} ms`);
    release();
    assert.equal((await first).status, 200);
  } finally {
    listening.closeAllConnections();
    listening.close();
    await strict.end();
  }
});

test('durable: a repeat whose read the replicas did not acknowledge gets the stored response with Idempotent-Replayed, the handler not run', async () => {
  runs = 0;
  useDurable = false;
  const first = await post('/durable', 'dk1', { item: 'x' });
  assert.equal(first.status, 201);
  useDurable = true;
  try {
    const repeat = await post('/durable', 'dk1', { item: 'x' });
    assert.equal(repeat.status, 201);
    assert.equal(repeat.headers.get('x-order'), 'o-1');
    assert.equal(repeat.headers.get('idempotent-replayed'), 'true');
    assert.equal(await repeat.text(), 'durable 1');
    assert.equal(runs, 1);
    assert.equal(durableIdem.stats.notDurable, 1);
  } finally {
    useDurable = false;
  }
});

test('durable: a first request whose claim the replicas did not acknowledge is 503 with Retry-After, the handler not run', async () => {
  runs = 0;
  useDurable = true;
  try {
    const refused = await post('/durable', 'nd1', { item: 'y' });
    assert.equal(refused.status, 503, await refused.text());
    assert.equal(refused.headers.get('retry-after'), '1');
    assert.equal(runs, 0);
    assert.equal((await durableIdem.get('http:nd1'))?.state, 'released');
  } finally {
    useDurable = false;
  }
});
