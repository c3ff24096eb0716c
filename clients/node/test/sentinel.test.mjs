// A Sentinel failover with work in flight: a primary, its replica and one
// Sentinel; workers on ioredis (`{ sentinels, name }`) and node-redis
// (`createSentinel`) take keys from one queue, each key delivered twice at
// once (the duplicate waits), with `durable: { replicas: 1 }`, while
// SENTINEL FAILOVER moves the primary. A broker's rules: a message is
// acknowledged when process() returns (a run or a replay); Busy,
// DoneUnconfirmed and NotDurable are not acknowledged: the message is
// delivered again. What must hold: every key ends done with its own result;
// a work ran more than once only after a run of it was reported
// DoneUnconfirmed or NotDurable at `done` (its completion may have been lost
// with the old primary, as docs/clients.md says: the redelivery replays or,
// once the lease lapsed, retries); no other error reaches a caller; and
// the old primary, which accepts writes until the Sentinel turns it into a
// replica, has nothing acted on: without a replica there, its claims are
// not acknowledged (NotDurable at `claim`: their work does not run) nor
// are its replays (NotDurable at `done`: a completion it alone holds, lost
// when it becomes a replica, is no reason to acknowledge). Module and Functions edition; client.mk runs it once, on Redis
// 7.0 (IDEM_FAILOVER=1).
import assert from 'node:assert/strict';
import { after, test } from 'node:test';
import { Idem } from '../dist/esm/index.js';
import { deliveries, sleep } from './helpers.mjs';
import { startSentinel } from './topology.mjs';

const WORKERS = 6;
const MIN_KEYS = 120;
const WORK_MS = 30;
const skip = process.env.IDEM_FAILOVER === '1' ? false : 'a Sentinel failover: set IDEM_FAILOVER=1 (client.mk runs it on one server)';
const NOT_ACKNOWLEDGED = ['BusyError', 'DoneUnconfirmedError', 'NotDurableError'];

const opened = [];
after(async () => Promise.all(opened.map((w) => w.stop())));

for (const edition of ['module', 'functions']) {
  test(`${edition}: a Sentinel failover with work in flight: each key done once, redeliveries only where the library said not to acknowledge`, { skip, timeout: 180000 }, async (t) => {
    const watched = await startSentinel({ functions: edition === 'functions' });
    opened.push(watched);
    const prefix = `sf:${edition}:`;
    const clients = [];
    for (let i = 0; i < WORKERS; i++) clients.push(i % 2 === 0 ? watched.ioredis() : await watched.nodeRedis());
    const options = { prefix, lease: 3000, wait: 5000, durable: { replicas: 1, timeout: 500 } };
    const idems = clients.map((c) => new Idem(c, options));
    const runs = new Map();
    const outcomes = new Map(); // key -> names of what its calls ended with, in order
    const unexpected = [];
    const queue = deliveries();
    const note = (key, what) => outcomes.set(key, [...(outcomes.get(key) ?? []), what]);
    const work = async (job) => {
      runs.set(job.key, (runs.get(job.key) ?? 0) + 1);
      await sleep(WORK_MS);
      return job.key;
    };
    const worker = async (idem) => {
      for (let key; (key = await queue.take()) !== null; ) {
        try {
          const outcome = await idem.process(key, work);
          assert.equal(outcome.value, key);
          note(key, outcome.replayed ? 'replayed' : 'ran');
        } catch (err) {
          note(key, err.stage ? `${err.name}:${err.stage}` : err.name);
          if (NOT_ACKNOWLEDGED.includes(err.name)) queue.put(key); // delivered again
          else unexpected.push(`${key}: ${err.name}: ${err.message}`);
        }
      }
    };
    let failedOver = false;
    const fed = [];
    const feed = async () => {
      while (!failedOver || fed.length < MIN_KEYS) {
        const key = `k${fed.length}`;
        fed.push(key);
        queue.put(key);
        queue.put(key);
        await sleep(40);
      }
    };
    const tasks = idems.map(worker);
    const close = async () => {
      for (const [i, idem] of idems.entries()) {
        await idem.close();
        await (i % 2 === 0 ? clients[i].quit() : clients[i].close()).catch(() => undefined);
      }
    };
    t.after(close);
    try {
      const feeding = feed();
      while (runs.size < 20) await sleep(10);
      await watched.failover();
      failedOver = true;
      await feeding;
      // every key acknowledged: wait until each has ended done, then stop the workers
      for (const deadline = Date.now() + 60000; ; await sleep(100)) {
        const pending = fed.filter((key) => !(outcomes.get(key) ?? []).some((o) => o === 'ran' || o === 'replayed'));
        if (pending.length === 0) break;
        if (Date.now() > deadline) throw new Error(`never acknowledged: ${pending.map((k) => `${k} ${outcomes.get(k)}`).join('; ')}`);
      }
    } finally {
      failedOver = true;
      for (let i = 0; i < WORKERS; i++) queue.put(null);
      await Promise.all(tasks);
    }

    const kinds = {};
    for (const list of outcomes.values()) for (const o of list) kinds[o] = (kinds[o] ?? 0) + 1;
    t.diagnostic(`${fed.length} keys; outcomes ${JSON.stringify(kinds)}; ran twice: ${fed.filter((k) => runs.get(k) > 1).length}`);
    assert.deepEqual(unexpected, []);
    for (const key of fed) {
      const record = await idems[0].get(key);
      assert.equal(record?.state, 'done', `${key}: ${JSON.stringify(record)} after ${outcomes.get(key)}`);
      assert.equal(record.result.toString(), JSON.stringify(key));
      const ran = runs.get(key) ?? 0;
      assert.ok(ran >= 1, `${key} never ran: ${outcomes.get(key)}`);
      if (ran > 1) {
        // run again only after a run whose completion the library said not to trust
        const said = outcomes.get(key).filter((o) => o === 'DoneUnconfirmedError' || o === 'NotDurableError:done');
        assert.ok(said.length >= ran - 1, `${key} ran ${ran} times after ${outcomes.get(key)}`);
      }
    }
    assert.ok(idems.reduce((n, idem) => n + idem.stats.waits, 0) > 0, 'duplicates waited');
  });
}
