// redis-idem/streams against a real server's streams, on each edition
// IDEM_CONFIGS names (module through ioredis, the Functions edition through
// node-redis): what brokers/scenario.py does not look at one by one. An
// entry stays pending while its work runs and is acknowledged once its
// record is done; a repeat of its key is a replay, acknowledged unrun; a
// failure comes again; Exhausted and a missing key go to the dead letter with
// the entry's id and the error; Busy is left pending until the holder's
// lease ends; Job.check() tells a work paused past its lease.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { LeaseLostError } from '../dist/esm/index.js';
import { StreamConsumer } from '../dist/esm/streams.js';
import { connect, sleep, startServer } from './helpers.mjs';
import { until } from './topology.mjs';

const configs = (process.env.IDEM_CONFIGS || 'module,functions').split(',').filter((c) => c === 'module' || c === 'functions');


for (const config of configs) {
  const kind = config === 'module' ? 'ioredis' : 'node-redis';
  describe(`${config} (${kind})`, () => {
    let server;
    let admin;
    let n = 0;
    const running = [];
    before(async () => {
      server = await startServer({ functions: config === 'functions' });
      admin = server.ioredis();
    });
    after(async () => {
      await Promise.all(running.map((stop) => stop())); // a failed test's too
      await admin.quit();
      await server.stop();
    });

    /** A fresh stream with `entries` ([fields...] each), an Idem and a consumer on it, running `handler`. */
    async function consume(entries, handler, { idemOptions = {}, ...options } = {}) {
      const stream = `s${++n}`;
      const ids = [];
      await admin.xgroup('CREATE', stream, 'g', '0', 'MKSTREAM');
      for (const fields of entries) ids.push(await admin.xadd(stream, '*', ...fields));
      const idem = await connect(kind, server, { prefix: `${stream}:`, lease: 1000, ...idemOptions });
      const consumer = new StreamConsumer(idem, { stream, group: 'g', consumer: 'c1', createGroup: true /* made already: BUSYGROUP is fine */, retryDelay: 50, ...options });
      const run = consumer.run(handler);
      const pending = async () => Number((await admin.xpending(stream, 'g'))[0]);
      const dead = async () => (await admin.xrange(`${stream}:dlq`, '-', '+')).map(([, f]) => Object.fromEntries(f.flatMap((v, i) => (i % 2 ? [] : [[v, f[i + 1]]]))));
      const delivered = async () => {
        const [group] = await admin.xinfo('GROUPS', stream);
        return group[group.indexOf('last-delivered-id') + 1] === ids.at(-1);
      };
      let stopped;
      const stop = () => (stopped ??= consumer.stop().then(() => run).then(() => idem.end()));
      running.push(stop);
      return { stream, ids, idem, consumer, pending, dead, delivered, stop };
    }

    test('an entry stays pending while its work runs, acknowledged once done; a repeat is a replay; no key: dead-lettered', async () => {
      const runs = [];
      let c;
      c = await consume([['idem-key', 'a', 'body', '1'], ['idem-key', 'a', 'body', '1 again'], ['body', 'keyless']], async (entry, job) => {
        const pendingIds = (await admin.xpending(c.stream, 'g', '-', '+', 10)).map(([id]) => id);
        runs.push([entry.fields.body, job.attempt, pendingIds.includes(entry.id)]);
        return entry.fields.body;
      });
      await until('all settled', async () => (await c.delivered()) && (await c.pending()) === 0 && (await c.dead()).length === 1);
      assert.equal((await c.idem.get('a')).state, 'done');
      await c.stop();
      assert.deepEqual(runs, [['1', 1, true]]); // pending while the work ran
      const [letter] = await c.dead();
      assert.equal(letter['original-id'], c.ids[2]);
      assert.equal(letter.body, 'keyless');
      assert.match(letter.error, /idem-key/);
      const { acknowledged, deadLettered, heldBack } = c.consumer.stats;
      assert.deepEqual({ acknowledged, deadLettered, heldBack }, { acknowledged: 2, deadLettered: 1, heldBack: 0 });
    });

    test('a failure is given back and comes again; Exhausted goes to the dead letter with its error, then acknowledged', async () => {
      const attempts = { flaky: [], poison: [] };
      const c = await consume([['idem-key', 'flaky'], ['idem-key', 'poison']], (entry, job) => {
        const key = entry.fields['idem-key'];
        attempts[key].push(job.attempt);
        if (key === 'poison' || job.attempt === 1) throw new Error(`${key} broke`);
        return 'ok';
      }, { idemOptions: { maxTries: 2 } });
      await until('all settled', async () => (await c.pending()) === 0 && (await c.dead()).length === 1);
      assert.equal((await c.idem.get('flaky')).state, 'done');
      await c.stop();
      assert.deepEqual(attempts, { flaky: [1, 2], poison: [1, 2] });
      const [letter] = await c.dead();
      assert.equal(letter['idem-key'], 'poison');
      assert.equal(letter['original-id'], c.ids[1]);
      assert.match(letter.error, /poison/);
      assert.ok(c.consumer.stats.heldBack >= 3, `held back ${c.consumer.stats.heldBack}`);
      assert.equal(c.consumer.stats.deadLettered, 1);
    });

    test("Busy is neither acknowledged nor run: left pending until the holder's lease ends", async () => {
      const runs = [];
      let c;
      // another holder's 1-second claim on the key, never completed
      const holder = await connect(kind, server, { prefix: `s${n + 1}:` });
      const claimed = await holder.claim('held', 1000);
      assert.equal(claimed.status, 'NEW');
      const at = Date.now();
      // wait: 0, so that the claim answers Busy at once rather than waiting for the holder
      c = await consume([['idem-key', 'held']], (entry, job) => runs.push([job.attempt, Date.now() - at]), { process: { wait: 0 } });
      await until('it was held back', () => c.consumer.stats.heldBack >= 1);
      assert.equal(await c.pending(), 1);
      assert.deepEqual(runs, []);
      await until('it ran', async () => (await c.pending()) === 0);
      await c.stop();
      await holder.end();
      assert.equal(runs.length, 1);
      assert.equal(runs[0][0], 2); // the lapsed holder's was attempt 1
      assert.ok(runs[0][1] >= 900, `ran ${runs[0][1]} ms after the holder's claim`);
      assert.equal(c.consumer.stats.heldBack, 1); // given back with the holder's lease as its delay, not spun on
    });

    test('Job.check(): a work paused past its lease learns it lost before its effect', async () => {
      const idem = await connect(kind, server, { prefix: 'check:', lease: 1000 });
      let before;
      const outcome = idem.process('k', async (job) => {
        job.check();
        before = 'held';
        await sleep(1200);
        job.check();
        return 'effect';
      }, { heartbeat: 0 });
      await assert.rejects(outcome, LeaseLostError);
      assert.equal(before, 'held');
      await idem.end();
    });
  });
}
