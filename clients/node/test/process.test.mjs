// The consumer loop beyond the conformance cases (which cover its
// branches: test/conformance.test.mjs), through both clients on the module:
// the hooks' arguments and order, the Job, prefixes and codecs, the
// server's own idem.max-result, durations refused before anything is sent,
// processMany's payloads and errors, and a DONE that is never confirmed.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createClient } from 'redis';
import { DoneUnconfirmedError, HookError, Idem, Job, MismatchError, raw } from '../dist/esm/index.js';
import { connect, startServer } from './helpers.mjs';
import { startProxy } from './proxy.mjs';

let server;
before(async () => (server = await startServer()));
after(() => server.stop());

for (const kind of ['ioredis', 'node-redis']) {
  describe(kind, () => {
    const opened = [];
    const open = async (options = {}) => {
      const idem = await connect(kind, server, { prefix: `${kind}:`, ...options });
      opened.push(idem);
      return idem;
    };
    after(() => Promise.all(opened.map((i) => i.end())));

    test('the hooks, in order, with the Job; a first run returns the work’s own object, a replay its JSON round trip', async () => {
      const seen = [];
      const idem = await open({
        hooks: {
          onRun: (job) => seen.push(['run', job.key, job.attempt, job.status, job instanceof Job, job.lost]),
          onDone: (job, stored) => seen.push(['done', job.key, stored]),
          onReplay: (key, attempt) => seen.push(['replay', key, attempt]),
          onRelease: (job, error) => seen.push(['release', job.key, error.message]),
          onResultDropped: (job, reason) => seen.push(['dropped', job.key, reason]),
        },
      });
      const value = { at: new Date(0), list: [1, 2] };
      const first = await idem.process('h1', () => value);
      assert.equal(first.value, value); // the very object
      const replay = await idem.process('h1', () => assert.fail('must not run'));
      assert.deepEqual(replay.value, { at: '1970-01-01T00:00:00.000Z', list: [1, 2] });
      await assert.rejects(idem.process('h2', () => { throw new Error('no'); }), /no/);
      await assert.rejects(idem.process('h3', () => 1n), (e) => e.name === 'ResultNotStoredError' && e.result === 1n && e.cause instanceof TypeError);
      assert.deepEqual(seen, [
        ['run', 'h1', 1, 'NEW', true, false],
        ['done', 'h1', true],
        ['replay', 'h1', 1],
        ['run', 'h2', 1, 'NEW', true, false],
        ['release', 'h2', 'no'],
        ['run', 'h3', 1, 'NEW', true, false],
        ['dropped', 'h3', 'unserializable'],
        ['done', 'h3', false],
      ]);
    });

    test('a hook that throws where its error is ignored changes nothing', async () => {
      const idem = await open({ hooks: { onReplay: () => { throw new Error('ignored'); } } });
      await idem.process('h4', () => 4);
      assert.equal((await idem.process('h4', () => 5)).value, 4);
    });

    test("the server's idem.max-result is read with CONFIG GET; a DONE it refuses for size completes without the result", async () => {
      const idem = await open();
      await idem.raw('CONFIG', 'SET', 'idem.max-result', '64');
      try {
        const outcome = await idem.process('m1', () => 'y'.repeat(80));
        assert.equal(outcome.resultStored, false);
        assert.equal((await idem.get('m1')).state, 'done');
        const unaware = await open({ maxResult: 1000, oversize: 'error' }); // believes the limit is higher than it is
        await assert.rejects(unaware.process('m2', () => 'y'.repeat(80)), (e) => e.name === 'ResultNotStoredError' && e.result.length === 80);
        assert.equal((await unaware.get('m2')).state, 'done');
        assert.equal(unaware.stats.resultsDropped, 1);
      } finally {
        await idem.raw('CONFIG', 'SET', 'idem.max-result', '1048576');
      }
    });

    test('prefixes keep tenants apart; the codec is pluggable', async () => {
      const t1 = await open({ prefix: `${kind}:tenant1:` });
      const t2 = await open({ prefix: `${kind}:tenant2:` });
      assert.equal((await t1.process('order:1', () => 'one')).replayed, false);
      assert.equal((await t2.process('order:1', () => 'two')).replayed, false);
      assert.equal((await t1.process('order:1', () => 'x')).value, 'one');
      const bytes = await open({ codec: raw });
      await bytes.process('bin', () => Buffer.from([1, 2, 3]));
      assert.deepEqual((await bytes.process('bin', () => Buffer.alloc(0))).value, Buffer.from([1, 2, 3]));
    });

    test('every duration is ms: a lease or retain that is not whole seconds is refused before anything is sent', async () => {
      const idem = await open();
      await assert.rejects(idem.process('d1', () => 1, { lease: 30 }), RangeError);
      await assert.rejects(idem.process('d1', () => 1, { retain: 1500 }), RangeError);
      await assert.rejects(idem.process('d1', () => 1, { wait: -1 }), RangeError);
      assert.equal(await idem.get('d1'), null);
      const outcome = await idem.process('d1', () => 1, { lease: 2000, retain: 5000, heartbeat: 0 });
      assert.ok((await idem.get('d1')).pttl <= 5000);
      assert.equal(outcome.value, 1);
    });

    test('processMany: payloads per key, a mismatch per key, an onRun that throws releases that key', async () => {
      const idem = await open({ hooks: { onRun: (job) => { if (job.key === 'pm:hook') throw new Error('hook failed'); } } });
      await idem.process('pm:a', () => 'a', { payload: 'A' });
      const items = await idem.processMany(['pm:a', 'pm:b', 'pm:hook'], (job) => job.key, { payloads: ['other', 'B', 'H'] });
      assert.deepEqual(items.map((i) => i.status), ['mismatch', 'processed', 'failed']);
      assert.ok(items[0].error instanceof MismatchError);
      assert.ok(items[2].error instanceof HookError);
      assert.equal((await idem.get('pm:hook')).state, 'released');
      assert.equal((await idem.get('pm:b')).fingerprint !== null, true);
      assert.equal(idem.stats.mismatches, 1);
      assert.equal(idem.stats.released, 1);
    });
  });
}

test('node-redis: every DONE reply lost: DONE sent again doneRetries times, then DoneUnconfirmedError carrying the result', async () => {
  const proxy = await startProxy(server.port);
  const client = createClient({ url: `redis://127.0.0.1:${proxy.port}` });
  client.on('error', () => undefined);
  await client.connect();
  const idem = new Idem(client, { prefix: 'unconfirmed:', doneRetries: 2 });
  try {
    await idem.edition();
    proxy.arm({ always: true });
    await assert.rejects(idem.process('k', () => ({ v: 1 })), (e) => e instanceof DoneUnconfirmedError && e.result.v === 1);
    // the first DONE reached the server: the record is done, and a redelivery replays it
    const record = await idem.get('k');
    assert.equal(record.state, 'done');
    assert.equal(record.result.toString(), '{"v":1}');
    assert.equal(idem.stats.completed, 0);
  } finally {
    await idem.close();
    await client.close();
    await proxy.stop();
  }
});
