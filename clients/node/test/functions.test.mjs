// The Functions edition (functions/idem.lua on a server without the
// module), through both clients: the same API, chosen by asking the server;
// what it cannot do (WAIT, BLOOM, the filters) throws ModuleRequiredError
// before anything is sent; BUSY is polled with backoff; the batch commands
// fall back to one single call per key.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Idem, ModuleRequiredError, NoEditionError, StaleError, WrongTypeError } from '../dist/esm/index.js';
import { connect, signal, sleep, startServer } from './helpers.mjs';

let server;
before(async () => (server = await startServer({ functions: true })));
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

    test('the edition is the Functions library, and every record command answers as the module does', async () => {
      const idem = await open();
      assert.equal(await idem.edition(), 'functions');
      const claim = await idem.claim('f1', 30, { payload: 'a', maxTries: 2 });
      assert.equal(claim.status, 'NEW');
      assert.match(claim.token, /^[0-9a-f]{32}$/);
      assert.equal((await idem.claim('f1', 30)).status, 'BUSY');
      assert.deepEqual(await idem.claim('f1', 30, { payload: 'b' }), { status: 'MISMATCH', attempt: 1 });
      await idem.extend('f1', claim.token, 40);
      assert.ok((await idem.get('f1')).leaseMs > 35000);
      assert.equal(await idem.release('f1', claim.token), true);
      assert.equal(await idem.release('f1', claim.token), false);
      const retry = await idem.claim('f1', 30, { payload: 'a', maxTries: 2 });
      assert.equal(retry.status, 'RETRY');
      assert.equal(retry.attempt, 2);
      await assert.rejects(idem.done('f1', claim.token), StaleError);
      await assert.rejects(idem.extend('f1', claim.token, 30), StaleError);
      assert.equal((await idem.done('f1', retry.token, { result: 'r', retain: 100 })).code, 1);
      assert.equal((await idem.done('f1', retry.token)).code, 0);
      const replay = await idem.claim('f1', 30);
      assert.equal(replay.status, 'DONE');
      assert.deepEqual(replay.result, Buffer.from('r'));
      const record = await idem.get('f1');
      assert.equal(record.state, 'done');
      assert.equal(record.attempt, 2);
      assert.match(record.fingerprint, /^[0-9a-f]{32}$/);
      assert.equal(await idem.get('nothing'), null);
      assert.equal(await idem.once('f2', 10), true);
      assert.equal(await idem.once('f2', 10), false);
      const spent = await idem.claim('f3', 30, { maxTries: 1 });
      await idem.release('f3', spent.token);
      assert.deepEqual(await idem.claim('f3', 30, { maxTries: 1 }), { status: 'EXHAUSTED', attempt: 1 });
      await idem.raw('SET', `${kind}:str`, 'x');
      await assert.rejects(idem.claim('str', 30), WrongTypeError);
    });

    test('what a function cannot do throws ModuleRequiredError, naming the module', async () => {
      const idem = await open();
      await assert.rejects(idem.claim('w', 30, { wait: 100 }), (e) => e instanceof ModuleRequiredError && /redis-idem module/.test(e.message));
      await assert.rejects(idem.claim('w', 30, { bloom: 'seen' }), ModuleRequiredError);
      await assert.rejects(idem.done('w', 'f'.repeat(32), { bloom: 'seen' }), ModuleRequiredError);
      await assert.rejects(idem.bf.add('seen', 'x'), ModuleRequiredError);
      await assert.rejects(idem.bf.reserve('seen', 0.01, 10), ModuleRequiredError);
      await assert.rejects(idem.bf.info('seen'), ModuleRequiredError);
      await assert.rejects(idem.process('w', () => 1, { bloom: 'seen' }), ModuleRequiredError);
      assert.equal(await idem.get('w'), null); // nothing was sent
      // the server's own stub answers the same way when called directly
      await assert.rejects(idem.raw('FCALL', 'idem_mclaim', 0), /needs the redis-idem module/);
    });

    test('process(): a duplicate polls with backoff while the first copy works, then replays', async () => {
      const a = await open();
      const b = await open();
      const started = signal();
      let runs = 0;
      const first = a.process('poll', async () => {
        runs++;
        started.resolve();
        await sleep(300);
        return { ok: true };
      });
      await started.promise;
      const duplicate = await b.process('poll', () => runs++, { waitMs: 3000 });
      assert.deepEqual(duplicate.value, { ok: true });
      assert.equal(duplicate.replayed, true);
      assert.equal(duplicate.waited, true);
      assert.equal((await first).replayed, false);
      assert.equal(runs, 1);
    });

    test('batches fall back to single calls, with the same answers and per-key errors', async () => {
      const idem = await open();
      await idem.raw('SET', `${kind}:bstr`, 'x');
      const claims = await idem.mclaim(['b1', 'bstr', 'b1'], 30);
      assert.equal(claims[0].status, 'NEW');
      assert.ok(claims[1] instanceof WrongTypeError);
      assert.equal(claims[2].status, 'BUSY');
      const done = await idem.mdone([
        { key: 'b1', token: claims[0].token, result: '"x"' },
        { key: 'b1', token: claims[0].token },
      ]);
      assert.deepEqual(done.map((d) => d.code), [1, 0]);
      const c = await idem.claim('b2', 30);
      assert.deepEqual(await idem.mrelease([{ key: 'b2', token: c.token }, { key: 'b2', token: c.token }]), [true, false]);
      const outcomes = await idem.processBatch(['b1', 'b2', 'b3'], (ctx) => ctx.attempt);
      assert.deepEqual(outcomes.map((o) => [o.status, o.value]), [['replayed', 'x'], ['processed', 2], ['processed', 1]]);
    });
  });
}

test('a server with both editions uses the module; one with neither says what to load', async () => {
  const both = await startServer({ functions: true, module: true });
  const neither = await startServer({ module: false });
  const a = await connect('ioredis', both);
  const b = await connect('node-redis', neither);
  try {
    assert.equal(await a.edition(), 'module');
    await assert.rejects(b.edition(), (e) => e instanceof NoEditionError && /FUNCTION LOAD/.test(e.message));
    assert.equal(await new Idem(b.client, { edition: 'functions' }).edition(), 'functions');
  } finally {
    await a.end();
    await b.end();
    await both.stop();
    await neither.stop();
  }
});
