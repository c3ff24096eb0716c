// idem.idempotent(fn, { key, payload }): the wrapper over process(), through
// both clients on the module: it runs once per key and replays, passes the
// function its own arguments and `this`, hands on what the function throws
// (the claim given back) and what process() throws, and takes process()'s
// options.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { ExhaustedError, MismatchError } from '../dist/esm/index.js';
import { connect, startServer } from './helpers.mjs';

let server;
before(async () => (server = await startServer()));
after(() => server.stop());

for (const kind of ['ioredis', 'node-redis']) {
  describe(kind, () => {
    let idem;
    before(async () => (idem = await connect(kind, server, { prefix: `idempotent:${kind}:`, lease: 5000, wait: 5000 })));
    after(() => idem.end());

    test('runs once per key, replays the stored result, and checks the payload', async () => {
      const calls = [];
      const charge = idem.idempotent(
        async (orderId, amount, currency = 'EUR') => {
          calls.push([orderId, amount, currency]);
          return { amount, currency, at: new Date(0) };
        },
        { key: (orderId) => `charge:${orderId}`, payload: (orderId, amount) => `${orderId}:${amount}` },
      );
      const first = await charge(1, 10, 'USD');
      assert.ok(first.at instanceof Date); // the function's own value
      assert.deepEqual(await charge(1, 10), { amount: 10, currency: 'USD', at: new Date(0).toISOString() }); // its JSON round trip
      assert.deepEqual(await charge(2, 5), { amount: 5, currency: 'EUR', at: new Date(0) });
      assert.deepEqual(calls, [[1, 10, 'USD'], [2, 5, 'EUR']]);
      assert.equal((await idem.get('charge:1')).state, 'done');
      await assert.rejects(charge(1, 99), MismatchError); // the key again with another payload
    });

    test('what the function throws goes on, the claim given back; the options are process()’s', async () => {
      let tries = 0;
      const flaky = idem.idempotent(
        () => {
          tries++;
          throw new Error('down');
        },
        { key: (id) => id, maxTries: 2 },
      );
      await assert.rejects(flaky('j'), /down/);
      assert.equal((await idem.get('j')).state, 'released'); // at once, not after the lease
      await assert.rejects(flaky('j'), /down/);
      await assert.rejects(flaky('j'), ExhaustedError);
      assert.equal(tries, 2);
    });

    test('a method keeps its `this`; a wrapper without a key function is refused when made', async () => {
      const service = {
        rate: 3,
        price: idem.idempotent(function (n) {
          return n * this.rate;
        }, { key: (n) => `price:${n}` }),
      };
      assert.equal(await service.price(2), 6);
      assert.equal(await service.price(2), 6);
      assert.throws(() => idem.idempotent(() => 1, { key: 'k' }), TypeError);
      assert.throws(() => idem.idempotent(() => 1, { key: () => 'k', payload: 'p' }), TypeError);
    });
  });
}
