// `durable` beyond the conformance cases, through both clients: the typed
// batch helpers (claimMany, doneMany) wait once and answer NotDurableError
// for the keys not acknowledged (a claim given back first); the fsync form
// (WAITAOF) completes where the server has it and its AOF is on, and where
// it refuses it (Redis 7.0 has no WAITAOF; AOF off) every call ends
// NotDurable before any work ran.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { Idem, NotDurableError } from '../dist/esm/index.js';
import { startServer } from './helpers.mjs';
import { startReplicated } from './topology.mjs';

let pair;
before(async () => (pair = await startReplicated()));
after(() => pair.stop());

async function open(kind, port, options) {
  let client;
  if (kind === 'ioredis') client = new Redis({ port, host: '127.0.0.1' });
  else {
    client = createClient({ url: `redis://127.0.0.1:${port}` });
    await client.connect();
  }
  const idem = new Idem(client, options);
  idem.end = async () => {
    await idem.close();
    await client.quit();
  };
  return idem;
}

for (const kind of ['ioredis', 'node-redis']) {
  describe(kind, () => {
    test('claimMany and doneMany wait once; what no replica acknowledged is NotDurableError, a claim given back first', async () => {
      const idem = await open(kind, pair.primary.port, { prefix: `${kind}:dm:`, durable: { replicas: 1, timeout: 300 } });
      try {
        const claims = await idem.claimMany(['{d}1', '{d}2'], 30000);
        assert.deepEqual(claims.map((c) => c.status), ['NEW', 'NEW']);
        const done = await idem.doneMany([{ key: '{d}1', token: claims[0].token, result: '1' }]);
        assert.equal(done[0].completed, true);
        await pair.detach();
        try {
          const unacked = await idem.claimMany(['{d}3', '{d}2'], 30000);
          assert.ok(unacked[0] instanceof NotDurableError && unacked[0].stage === 'claim', String(unacked[0]));
          assert.equal(unacked[1].status, 'BUSY'); // not granted: nothing to give back
          assert.equal((await idem.get('{d}3')).state, 'released');
          const late = await idem.doneMany([{ key: '{d}2', token: claims[1].token, result: '2' }]);
          assert.ok(late[0] instanceof NotDurableError && late[0].stage === 'done', String(late[0]));
          assert.equal((await idem.get('{d}2')).state, 'done'); // done on the primary
        } finally {
          await pair.attach();
        }
      } finally {
        await idem.end();
      }
    });

    // as process() reads a claim's WAIT (core's claimNotDurable): with one replica, asking for 2
    test('claimMany: a key answered DONE whose WAIT fell short is NotDurableError at stage done, nothing released', async () => {
      const prefix = `${kind}:dr:`;
      const plain = await open(kind, pair.primary.port, { prefix });
      const one = await open(kind, pair.primary.port, { prefix, durable: { replicas: 1, timeout: 2000 } });
      const two = await open(kind, pair.primary.port, { prefix, durable: { replicas: 2, timeout: 300 } });
      try {
        const [c] = await plain.claimMany(['{r}d'], 30000);
        await plain.doneMany([{ key: '{r}d', token: c.token, result: '"stored"' }]);
        const acked = await one.claimMany(['{r}d', '{r}n1'], 30000);
        assert.deepEqual(acked.map((a) => a.status), ['DONE', 'NEW']);
        assert.equal(one.stats.notDurable, 0);
        const short = await two.claimMany(['{r}d', '{r}n2'], 30000);
        assert.ok(short[0] instanceof NotDurableError && short[0].stage === 'done' && short[0].acknowledged === 1, String(short[0]));
        assert.equal(Buffer.from(short[0].result).toString(), '"stored"');
        assert.ok(short[1] instanceof NotDurableError && short[1].stage === 'claim' && short[1].acknowledged === 1, String(short[1]));
        assert.equal(two.stats.notDurable, 2);
        assert.equal((await plain.get('{r}d')).state, 'done');
        assert.equal((await plain.get('{r}n2')).state, 'released');
      } finally {
        await Promise.all([plain.end(), one.end(), two.end()]);
      }
    });
  });
}

describe('fsync (WAITAOF)', () => {
  let aof;
  let noAof;
  before(async () => {
    aof = await startServer({ args: ['--appendonly', 'yes', '--appendfsync', 'always'] });
    noAof = await startServer();
  });
  after(async () => {
    await aof?.stop();
    await noAof?.stop();
  });

  for (const kind of ['ioredis', 'node-redis']) {
    test(`${kind}: completes where the server has WAITAOF and its AOF is on; refused, NotDurable before any work ran`, async () => {
      const probe = aof.ioredis();
      const hasWaitaof = (await probe.call('COMMAND', 'INFO', 'WAITAOF'))[0] !== null;
      await probe.quit();
      const durable = { replicas: 0, timeout: 1000, fsync: true };
      const onAof = await open(kind, aof.port, { prefix: `${kind}:aof:`, durable });
      const offAof = await open(kind, noAof.port, { prefix: `${kind}:aof:`, durable });
      try {
        let ran = 0;
        const work = () => ++ran;
        if (hasWaitaof) {
          assert.equal((await onAof.process('k', work)).value, 1);
          assert.equal((await onAof.get('k')).state, 'done');
        }
        for (const idem of hasWaitaof ? [offAof] : [onAof, offAof]) {
          await assert.rejects(idem.process('r', work), (e) => e instanceof NotDurableError && e.stage === 'claim' && e.acknowledged === -1);
          assert.equal((await idem.get('r')).state, 'released');
          assert.equal(idem.stats.notDurable, 1);
        }
        assert.equal(ran, hasWaitaof ? 1 : 0);
      } finally {
        await onAof.end();
        await offAof.end();
      }
    });
  }
});
