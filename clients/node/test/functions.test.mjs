// The Functions edition (functions/idem.lua on a server without the
// module), through both clients: the same API, chosen by asking the server;
// what it cannot do (WAIT, BLOOM, the filters, the raw batch commands)
// throws ModuleRequiredError before anything is sent; the batch helpers
// (claimMany, doneMany, releaseMany) send one single call per key. The
// loop's cases on this edition are the conformance runner's.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { Idem, ModuleRequiredError, NotInstalledError, StaleError, WrongTypeError } from '../dist/esm/index.js';
import { connect, startServer } from './helpers.mjs';

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
      const claim = await idem.claim('f1', 30000, { payload: 'a', maxTries: 2 });
      assert.equal(claim.status, 'NEW');
      assert.match(claim.token, /^[0-9a-f]{32}$/);
      assert.equal((await idem.claim('f1', 30000)).status, 'BUSY');
      assert.deepEqual(await idem.claim('f1', 30000, { payload: 'b' }), { status: 'MISMATCH', attempt: 1 });
      await idem.extend('f1', claim.token, 40000);
      assert.ok((await idem.get('f1')).leaseMs > 35000);
      assert.equal(await idem.release('f1', claim.token), true);
      assert.equal(await idem.release('f1', claim.token), false);
      const retry = await idem.claim('f1', 30000, { payload: 'a', maxTries: 2 });
      assert.equal(retry.status, 'RETRY');
      assert.equal(retry.attempt, 2);
      await assert.rejects(idem.done('f1', claim.token), StaleError);
      await assert.rejects(idem.extend('f1', claim.token, 30000), StaleError);
      assert.equal((await idem.done('f1', retry.token, { result: 'r', retain: 100000 })).code, 1);
      assert.equal((await idem.done('f1', retry.token)).code, 0);
      const replay = await idem.claim('f1', 30000);
      assert.equal(replay.status, 'DONE');
      assert.deepEqual(replay.result, Buffer.from('r'));
      const record = await idem.get('f1');
      assert.equal(record.state, 'done');
      assert.equal(record.attempt, 2);
      assert.match(record.fingerprint, /^[0-9a-f]{32}$/);
      assert.equal(await idem.get('nothing'), null);
      assert.equal(await idem.once('f2', 10000), true);
      assert.equal(await idem.once('f2', 10000), false);
      const spent = await idem.claim('f3', 30000, { maxTries: 1 });
      await idem.release('f3', spent.token);
      assert.deepEqual(await idem.claim('f3', 30000, { maxTries: 1 }), { status: 'EXHAUSTED', attempt: 1 });
      await idem.raw('SET', `${kind}:str`, 'x');
      await assert.rejects(idem.claim('str', 30000), WrongTypeError);
    });

    test('what a function cannot do throws ModuleRequiredError, naming the module', async () => {
      const idem = await open();
      await assert.rejects(idem.claim('w', 30000, { wait: 100 }), (e) => e instanceof ModuleRequiredError && /redis-idem module/.test(e.message));
      await assert.rejects(idem.claim('w', 30000, { bloom: 'seen' }), ModuleRequiredError);
      await assert.rejects(idem.done('w', 'f'.repeat(32), { bloom: 'seen' }), ModuleRequiredError);
      await assert.rejects(idem.bf.add('seen', 'x'), ModuleRequiredError);
      await assert.rejects(idem.bf.reserve('seen', 0.01, 10), ModuleRequiredError);
      await assert.rejects(idem.bf.info('seen'), ModuleRequiredError);
      await assert.rejects(idem.process('w', () => 1, { bloom: 'seen' }), ModuleRequiredError);
      assert.equal(await idem.get('w'), null); // nothing was sent
      // the server's own stub answers the same way when called directly
      await assert.rejects(idem.raw('FCALL', 'idem_mclaim', 0), /needs the redis-idem module/);
    });

    test('the batch helpers send single calls, with the same answers; the raw batch commands need the module', async () => {
      const idem = await open();
      await idem.raw('SET', `${kind}:bstr`, 'x');
      await assert.rejects(idem.mclaim(['b1'], 30000), ModuleRequiredError);
      await assert.rejects(idem.mdone([{ key: 'b1', token: 'f'.repeat(32) }]), ModuleRequiredError);
      await assert.rejects(idem.mrelease([{ key: 'b1', token: 'f'.repeat(32) }]), ModuleRequiredError);
      const claims = await idem.claimMany(['b1', 'bstr', 'b1'], 30000);
      assert.equal(claims[0].status, 'NEW');
      assert.ok(claims[1] instanceof WrongTypeError);
      assert.equal(claims[2].status, 'BUSY');
      const done = await idem.doneMany([
        { key: 'b1', token: claims[0].token, result: '"x"' },
        { key: 'b1', token: claims[0].token },
      ]);
      assert.deepEqual(done.map((d) => d.code), [1, 0]);
      const c = await idem.claim('b2', 30000);
      assert.deepEqual(await idem.releaseMany([{ key: 'b2', token: c.token }, { key: 'b2', token: c.token }]), [true, false]);
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
    await assert.rejects(b.edition(), (e) => e instanceof NotInstalledError && /FUNCTION LOAD/.test(e.message));
    assert.equal(await new Idem(b.client, { edition: 'functions' }).edition(), 'functions');
  } finally {
    await a.end();
    await b.end();
    await both.stop();
    await neither.stop();
  }
});
