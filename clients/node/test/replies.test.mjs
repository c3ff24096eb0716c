// Every reply and status of every record and filter command, typed, through
// both ioredis and node-redis, on the module.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import {
  Idem,
  ClaimStatus,
  IdemReplyError,
  ModuleRequiredError,
  StaleError,
  WrongTypeError,
  ResultTooLargeError,
} from '../dist/esm/index.js';
import { bothClients, startServer } from './helpers.mjs';

const MAX_BATCH_KEYS = 10000; // the module's numkeys limit: a larger batch goes in several calls

let server;
let clients;
before(async () => {
  server = await startServer();
  clients = await bothClients(server);
});
after(async () => {
  await clients.close();
  await server.stop();
});

// node-redis v4 (the npm alias redis4) too: its sendCommand and errors differ from v5's.
for (const kind of ['ioredis', 'node-redis', 'node-redis v4']) {
  describe(kind, () => {
    let idem;
    let raw; // the client itself, for set-up the library has no command for
    const rawCall = (...args) => (kind === 'ioredis' ? raw.call(...args) : raw.sendCommand(args.map(String)));
    before(async () => {
      if (kind === 'node-redis v4') {
        const { createClient } = await import('redis4');
        raw = createClient({ url: server.url });
        await raw.connect();
      } else raw = clients.find(([k]) => k === kind)[2];
      idem = new Idem(raw, { prefix: `${kind}:` });
    });
    after(async () => {
      if (kind === 'node-redis v4') await raw.quit();
    });

    test('the server is asked which edition it runs', async () => {
      assert.equal(await idem.edition(), 'module');
    });

    test('CLAIM: NEW, BUSY, DONE with the result, and the statuses as a union', async () => {
      const claim = await idem.claim('c1', 30000);
      assert.equal(claim.status, ClaimStatus.NEW);
      assert.match(claim.token, /^[0-9a-f]{32}$/);
      assert.equal(claim.attempt, 1);
      const busy = await idem.claim('c1', 30000);
      assert.equal(busy.status, 'BUSY');
      assert.ok(busy.leaseLeft > 25000 && busy.leaseLeft <= 30000, `leaseLeft ${busy.leaseLeft}`);
      assert.equal(busy.attempt, 1);
      const done = await idem.done('c1', claim.token, { result: Buffer.from([0, 255, 10]) });
      assert.deepEqual(done, { code: 1, completed: true, alreadyDone: false, resultDropped: false, bloomDropped: false });
      const replay = await idem.claim('c1', 30000);
      assert.equal(replay.status, 'DONE');
      assert.deepEqual(replay.result, Buffer.from([0, 255, 10]));
      assert.equal(replay.attempt, 1);
      // DONE again, with any token: 0, nothing changed
      assert.deepEqual(await idem.done('c1', claim.token), { code: 0, completed: false, alreadyDone: true, resultDropped: false, bloomDropped: false });
    });

    test('CLAIM: DONE without a result replays null; an empty result replays empty', async () => {
      const a = await idem.claim('c-nil', 30000);
      await idem.done('c-nil', a.token);
      assert.equal((await idem.claim('c-nil', 30000)).result, null);
      const b = await idem.claim('c-empty', 30000);
      await idem.done('c-empty', b.token, { result: '' });
      assert.deepEqual((await idem.claim('c-empty', 30000)).result, Buffer.alloc(0));
    });

    test('RELEASE then CLAIM: RETRY with attempt 2; RELEASE of a stale token answers false', async () => {
      const first = await idem.claim('c2', 30000);
      assert.equal(await idem.release('c2', first.token), true);
      assert.equal(await idem.release('c2', first.token), false);
      const retry = await idem.claim('c2', 30000);
      assert.equal(retry.status, 'RETRY');
      assert.equal(retry.attempt, 2);
      assert.notEqual(retry.token, first.token);
      // the first token is superseded: DONE and EXTEND are STALE
      await assert.rejects(idem.done('c2', first.token), (e) => e instanceof StaleError && /^STALE/.test(e.message));
      await assert.rejects(idem.extend('c2', first.token, 30000), StaleError);
      await idem.extend('c2', retry.token, 60000);
      assert.ok((await idem.get('c2')).leaseMs > 55000);
    });

    test('MISMATCH and EXHAUSTED', async () => {
      const claim = await idem.claim('c3', 30000, { payload: 'body-1', maxTries: 1 });
      const mismatch = await idem.claim('c3', 30000, { payload: 'body-2' });
      assert.deepEqual(mismatch, { status: 'MISMATCH', attempt: 1 });
      await idem.release('c3', claim.token);
      assert.deepEqual(await idem.claim('c3', 30000, { payload: 'body-1', maxTries: 1 }), { status: 'EXHAUSTED', attempt: 1 });
    });

    test('SEEN with BLOOM, and the filter commands', async () => {
      await idem.bf.reserve('seen', 0.01, 1000, { window: 3, shard: 'HOUR', expansion: 2 });
      assert.equal(await idem.bf.add('seen', 'c4'), true);
      assert.equal(await idem.bf.add('seen', 'c4'), false);
      assert.deepEqual(await idem.bf.madd('seen', ['x', 'c4', 'x']), [true, false, false]);
      assert.equal(await idem.bf.exists('seen', 'x'), true);
      assert.deepEqual(await idem.bf.mexists('seen', ['x', 'nope']), [true, false]);
      const info = await idem.bf.info('seen');
      assert.equal(info.errorRate, 0.01);
      assert.equal(info.capacity, 1000);
      assert.equal(info.window, 3);
      assert.equal(info.shard, 3600000); // ms, as every duration
      assert.equal(info.expansion, 2);
      assert.equal(info.items, 2);
      assert.equal(info.shards.length, 1);
      assert.ok(info.shards[0].bytes > 0 && info.shards[0].filters === 1);
      assert.equal(await idem.bf.info('no-filter'), null);
      // the record key's name is what the filter holds: the prefixed one
      await idem.bf.add('seen', `${kind}:c5`);
      const seen = await idem.claim('c5', 30000, { bloom: 'seen' });
      assert.equal(seen.status, 'SEEN');
      assert.equal(seen.attempt, 1);
      assert.equal((await idem.done('c5', seen.token, { bloom: 'seen' })).code, 1);
      await assert.rejects(idem.bf.reserve('seen', 0.01, 1000), (e) => e instanceof IdemReplyError && /key already exists/.test(e.message));
    });

    test('DONE decodes 1, 3, 5 and 7: what was dropped', async () => {
      await rawCall('SET', `${kind}:not-a-filter`, 'x');
      const claims = [];
      for (const name of ['d3', 'd5', 'd7']) claims.push((await idem.claim(name, 30000)).token);
      const five = await idem.done('d5', claims[1], { result: 'r', bloom: 'not-a-filter' });
      assert.deepEqual(five, { code: 5, completed: true, alreadyDone: false, resultDropped: false, bloomDropped: true });
      await rawCall('CONFIG', 'SET', 'maxmemory', '1');
      try {
        const three = await idem.done('d3', claims[0], { result: 'r' });
        assert.deepEqual(three, { code: 3, completed: true, alreadyDone: false, resultDropped: true, bloomDropped: false });
        const seven = await idem.done('d7', claims[2], { result: 'r', bloom: 'not-a-filter' });
        assert.deepEqual(seven, { code: 7, completed: true, alreadyDone: false, resultDropped: true, bloomDropped: true });
      } finally {
        await rawCall('CONFIG', 'SET', 'maxmemory', '0');
      }
      assert.equal((await idem.claim('d3', 30000)).result, null);
    });

    test('GET: the typed record, and null', async () => {
      assert.equal(await idem.get('absent'), null);
      const before = Date.now();
      const claim = await idem.claim('g1', 30000, { payload: 'p' });
      const processing = await idem.get('g1');
      assert.equal(processing.state, 'processing');
      assert.equal(processing.attempt, 1);
      assert.ok(processing.leaseMs > 25000);
      assert.ok(processing.pttl > processing.leaseMs);
      assert.ok(processing.claimedAt >= before - 1000 && processing.claimedAt <= Date.now() + 1000);
      assert.equal(processing.doneAt, 0);
      assert.equal(processing.result, null);
      assert.match(processing.fingerprint, /^[0-9a-f]{32}$/);
      await idem.done('g1', claim.token, { result: 'out', retain: 100000 });
      const done = await idem.get('g1');
      assert.equal(done.state, 'done');
      assert.equal(done.leaseMs, 0);
      assert.ok(done.doneAt >= done.claimedAt);
      assert.deepEqual(done.result, Buffer.from('out'));
      assert.ok(done.pttl > 95000 && done.pttl <= 100000);
      const released = await idem.claim('g2', 30000);
      await idem.release('g2', released.token);
      assert.equal((await idem.get('g2')).state, 'released');
    });

    test('ONCE: true the first time, false after', async () => {
      assert.equal(await idem.once('o1', 60000), true);
      assert.equal(await idem.once('o1', 60000), false);
      const record = await idem.get('o1');
      assert.equal(record.state, 'done');
      assert.equal(record.attempt, 0);
    });

    test('errors are typed: WRONGTYPE, a result too large, a syntax error', async () => {
      await rawCall('SET', `${kind}:string`, 'x');
      await assert.rejects(idem.claim('string', 30000), WrongTypeError);
      // durations are ms; a lease the server takes in seconds is refused unless whole seconds, before anything is sent
      await assert.rejects(idem.claim('bad', 0), RangeError);
      await assert.rejects(idem.claim('bad', 1500), /whole seconds/);
      assert.equal(await idem.get('bad'), null);
      await rawCall('CONFIG', 'SET', 'idem.max-result', '10');
      try {
        const claim = await idem.claim('big', 30000);
        await assert.rejects(idem.done('big', claim.token, { result: 'x'.repeat(11) }), ResultTooLargeError);
      } finally {
        await rawCall('CONFIG', 'SET', 'idem.max-result', '1048576');
      }
    });

    test('MCLAIM / MDONE / MRELEASE: each key its own answer, per-key errors as Error elements', async () => {
      await rawCall('SET', `${kind}:b-string`, 'x');
      const keys = ['b1', 'b2', 'b-string', 'b1'];
      const claims = await idem.mclaim(keys, 30000, { payloads: ['p1', 'p2', 'p3', 'p1'] });
      assert.equal(claims.length, 4);
      assert.equal(claims[0].status, 'NEW');
      assert.equal(claims[1].status, 'NEW');
      assert.ok(claims[2] instanceof WrongTypeError, String(claims[2]));
      assert.equal(claims[3].status, 'BUSY'); // the second b1 sees the first's claim
      const done = await idem.mdone([
        { key: 'b1', token: claims[0].token, result: 'one' },
        { key: 'b2', token: 'f'.repeat(32), result: 'two' },
      ]);
      assert.equal(done[0].code, 1);
      assert.ok(done[1] instanceof StaleError, String(done[1]));
      const released = await idem.mrelease([
        { key: 'b2', token: claims[1].token },
        { key: 'b2', token: claims[1].token },
      ]);
      assert.deepEqual(released, [true, false]);
      const again = await idem.mclaim(['b1', 'b2'], 30000);
      assert.equal(again[0].status, 'DONE');
      assert.deepEqual(again[0].result, Buffer.from('one'));
      assert.equal(again[1].status, 'RETRY');
      assert.equal(again[1].attempt, 2);
    });

    test(`a batch of more than ${MAX_BATCH_KEYS} keys is cut into calls the server takes`, async () => {
      const keys = Array.from({ length: MAX_BATCH_KEYS + 5 }, (_, i) => `many:${i}`);
      const claims = await idem.mclaim(keys, 30000);
      assert.equal(claims.length, keys.length);
      assert.ok(claims.every((c) => c.status === 'NEW'));
      const done = await idem.mdone(keys.map((key, i) => ({ key, token: claims[i].token })));
      assert.ok(done.every((d) => d.code === 1));
      assert.equal((await idem.get(`many:${MAX_BATCH_KEYS + 4}`)).state, 'done');
    });
  });
}

for (const [version, pkg] of [['v5', 'redis'], ['v4', 'redis4']]) {
  test(`node-redis ${version} module: client.idem.claim() and the others, typed`, async () => {
    const { createClient } = await import(pkg);
    const { idemModule, replyError } = await import('../dist/esm/index.js');
    const client = createClient({ url: server.url, modules: { idem: idemModule } });
    await client.connect();
    const k = `module-${version}`;
    try {
      const claim = await client.idem.claim(`${k}:1`, 30000, { payload: 'x' });
      assert.equal(claim.status, 'NEW');
      assert.equal((await client.idem.claim(`${k}:1`, 30000)).status, 'BUSY');
      assert.equal(await client.idem.extend(`${k}:1`, claim.token, 30000), undefined);
      assert.equal((await client.idem.done(`${k}:1`, claim.token, { result: 'r' })).code, 1);
      assert.equal((await client.idem.get(`${k}:1`)).state, 'done');
      assert.equal(await client.idem.once(`${k}:2`, 10000), true);
      assert.equal(await client.idem.release(`${k}:1`, claim.token), false);
      await assert.rejects(client.idem.extend(`${k}:1`, claim.token, 30000), (e) => replyError(e) instanceof StaleError);
      assert.equal(await client.idem.bfAdd(`${k}:f`, 'a'), true);
      assert.deepEqual(await client.idem.bfMexists(`${k}:f`, ['a', 'b']), [true, false]);
    } finally {
      await client.quit();
    }
  });
}

test('ModuleRequiredError is for the Functions edition only', () => {
  assert.ok(ModuleRequiredError.prototype instanceof Error);
});
