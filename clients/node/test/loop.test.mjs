// The loop's costs and rules beyond the conformance cases, through both
// clients on the module: concurrent calls share one IDEM.MCLAIM / IDEM.MDONE
// per tick (and do not with `batch: false`), a call alone sends IDEM.CLAIM;
// no timer per message (the heartbeat is one clock per instance); a DONE
// refused with an error other than STALE is that error, never a
// completion; settings are checked when the Idem is made.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Idem, WrongTypeError } from '../dist/esm/index.js';
import { connect, signal, startServer } from './helpers.mjs';

let server;
let admin;
before(async () => {
  server = await startServer();
  admin = server.ioredis();
});
after(async () => {
  await admin.quit();
  await server.stop();
});

/** Calls of each command since `since()` was called. */
async function counting() {
  await admin.call('CONFIG', 'RESETSTAT');
  return async () => {
    const stats = await admin.info('commandstats');
    const calls = (name) => Number(stats.match(new RegExp(`cmdstat_${name.replace('.', '\\.')}:calls=(\\d+)`, 'i'))?.[1] ?? 0);
    return { claim: calls('idem.claim'), mclaim: calls('idem.mclaim'), done: calls('idem.done'), mdone: calls('idem.mdone') };
  };
}

const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;

for (const kind of ['ioredis', 'node-redis']) {
  describe(kind, () => {
    const opened = [];
    const open = async (options = {}) => {
      const idem = await connect(kind, server, { prefix: `${kind}:loop:`, ...options });
      opened.push(idem);
      await idem.edition();
      return idem;
    };
    after(() => Promise.all(opened.map((i) => i.end())));

    test('concurrent calls share one IDEM.MCLAIM and one IDEM.MDONE per tick, each with its own answer', async () => {
      const idem = await open();
      await idem.process('b:replayed', () => 'stored');
      await admin.set(`${kind}:loop:b:plain`, 'x');
      const calls = await counting();
      const keys = Array.from({ length: 40 }, (_, i) => `b:${i}`);
      const results = await Promise.allSettled([
        ...keys.map((key) => idem.process(key, (job) => job.key.toUpperCase())),
        idem.process('b:replayed', () => 'again'),
        idem.process('b:plain', () => 'never'),
      ]);
      keys.forEach((key, i) => assert.deepEqual(results[i].value, { value: key.toUpperCase(), replayed: false, attempt: 1, status: 'NEW', resultStored: true, waited: false }));
      assert.equal(results[40].value.value, 'stored');
      assert.ok(results[41].reason instanceof WrongTypeError, String(results[41].reason));
      const seen = await calls();
      // the first call alone (nothing in flight), the others queued behind it
      assert.equal(seen.claim, 1, JSON.stringify(seen));
      assert.ok(seen.mclaim >= 1 && seen.mclaim <= 3, JSON.stringify(seen));
      assert.ok(seen.done + seen.mdone < keys.length / 2, JSON.stringify(seen));
      assert.equal(idem.stats.firstRuns, 41);
      assert.equal(idem.stats.completed, 41);
      assert.equal(idem.stats.replays, 1);
    });

    test('batch: false sends one IDEM.CLAIM and one IDEM.DONE per call; a call alone never waits for a batch', async () => {
      const idem = await open({ batch: false });
      const calls = await counting();
      await Promise.all(Array.from({ length: 20 }, (_, i) => idem.process(`s:${i}`, () => i)));
      assert.deepEqual(await calls(), { claim: 20, mclaim: 0, done: 20, mdone: 0 });
      const alone = await open();
      const again = await counting();
      for (let i = 0; i < 5; i++) await alone.process(`a:${i}`, () => i);
      assert.deepEqual(await again(), { claim: 5, mclaim: 0, done: 5, mdone: 0 });
    });

    test('no timer per message: 200 works held at once arm one timer for the instance', async () => {
      const idem = await open({ lease: 30000 });
      const before = timers();
      const gate = signal();
      const running = Array.from({ length: 200 }, (_, i) => idem.process(`t:${i}`, () => gate.promise.then(() => i)));
      while (idem.stats.firstRuns < 200) await new Promise((r) => setImmediate(r));
      assert.ok(timers() - before <= 1, `${timers() - before} timers for 200 works in flight`);
      gate.resolve();
      await Promise.all(running);
      assert.equal(idem.stats.completed, 200);
    });

    test('a DONE refused with another error than STALE (the key overwritten) is that error, never a completion', async () => {
      const idem = await open();
      await assert.rejects(
        idem.process('w:1', async (job) => {
          await admin.set(`${kind}:loop:${job.key}`, 'overwritten');
          return 'v';
        }),
        WrongTypeError,
      );
      assert.equal(await admin.get(`${kind}:loop:w:1`), 'overwritten');
      assert.equal(idem.stats.completed, 0);
      assert.equal(idem.stats.leasesLost, 0);
    });

    test('settings are checked when the Idem is made', async () => {
      const client = opened[0].client;
      assert.throws(() => new Idem(client, { lease: 1500 }), RangeError);
      assert.throws(() => new Idem(client, { owner: '' }), RangeError);
      assert.throws(() => new Idem(client, { owner: 'x'.repeat(65) }), RangeError);
      assert.throws(() => new Idem(client, { durable: { replicas: -1 } }), RangeError);
      assert.throws(() => new Idem(client, { doneRetries: 1.5 }), RangeError);
    });
  });
}
