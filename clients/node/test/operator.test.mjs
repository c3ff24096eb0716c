// The operator calls, scan() and requeue(), through both clients on the
// module and on the Functions edition: a dead letter (maxTries 2, two failed
// works) is listed by scan({ state: 'released', minTries: 2 }), requeued, and
// completes on its next process() with attempt 3; a live lease is refused
// with LiveLeaseError. scan() over every primary of a cluster: cluster.test.mjs.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { ExhaustedError, LiveLeaseError } from '../dist/esm/index.js';
import { connect, startServer } from './helpers.mjs';

const configs = (process.env.IDEM_CONFIGS || 'module,functions').split(',').filter((c) => c === 'module' || c === 'functions');

const sorted = async (iterable) => {
  const keys = [];
  for await (const key of iterable) keys.push(key);
  return [...new Set(keys)].sort();
};

for (const edition of configs) {
  describe(edition, () => {
    let server;
    before(async () => (server = await startServer({ functions: edition === 'functions' })));
    after(() => server.stop());

    for (const kind of ['ioredis', 'node-redis']) {
      test(`${kind}: a dead letter listed by scan, requeued, then completed with a higher attempt`, async () => {
        const prefix = `${kind}:op[1]*:`; // glob characters: matched as they are
        const idem = await connect(kind, server, { prefix });
        try {
          assert.equal(await idem.edition(), edition);
          for (let i = 1; i <= 2; i++) {
            await assert.rejects(idem.process('dead', () => Promise.reject(new Error(`try ${i}`)), { maxTries: 2 }), /try/);
          }
          await assert.rejects(idem.process('dead', () => 'never', { maxTries: 2 }), ExhaustedError);
          const live = await idem.claim('live', 60000);
          const done = await idem.claim('done', 60000);
          await idem.done('done', done.token, { result: '"r"' });
          await idem.raw('SET', `${prefix}plain`, 'x');
          await idem.raw('SET', 'elsewhere', 'x'); // outside the prefix: never listed
          const decoy = await connect(kind, server, { prefix: `${kind}:op1x:` }); // a record the prefix as an unescaped glob would match
          await decoy.claim('decoy', 60000);
          await decoy.end();

          assert.deepEqual(await sorted(idem.scan({ count: 5 })), ['dead', 'done', 'live']);
          assert.deepEqual(await sorted(idem.scan({ state: 'released', minTries: 2 })), ['dead']);
          assert.deepEqual(await sorted(idem.scan({ state: 'released', minTries: 3 })), []);
          assert.deepEqual(await sorted(idem.scan({ state: 'processing' })), ['live']);
          assert.deepEqual(await sorted(idem.scan({ match: 'd*', state: 'done' })), ['done']);
          assert.deepEqual(await sorted(idem.scan({ idle: 3600000 })), []);
          await assert.rejects(idem.scan({ idle: 1500 }).next(), RangeError); // whole seconds only
          const before = await idem.get('dead');
          assert.deepEqual([before.state, before.attempt, before.tries], ['released', 2, 2]);

          assert.equal(await idem.requeue('dead'), true);
          const requeued = await idem.get('dead');
          assert.deepEqual([requeued.state, requeued.attempt, requeued.tries], ['released', 2, 0]);
          assert.equal(await idem.requeue('absent'), false);
          await assert.rejects(idem.requeue('live'), (err) => err instanceof LiveLeaseError && /live lease/.test(err.message));
          assert.equal((await idem.get('live')).state, 'processing');
          assert.equal((await idem.release('live', live.token)), true);

          const outcome = await idem.process('dead', (job) => `done at ${job.attempt}`, { maxTries: 2 });
          assert.equal(outcome.value, 'done at 3');
          const record = await idem.get('dead');
          assert.deepEqual([record.state, record.attempt, record.tries], ['done', 3, 1]);
          assert.deepEqual(await sorted(idem.scan({ state: 'released', minTries: 2 })), []);
        } finally {
          await idem.end();
        }
      });
    }
  });
}
