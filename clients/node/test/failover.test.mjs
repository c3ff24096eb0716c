// A planned failover in a cluster of 3 primaries with a replica each: the
// loop goes on through `CLUSTER FAILOVER` on every primary's replica in turn.
// Worker tasks (each with its own cluster client, as worker processes would
// have; half ioredis Cluster, half node-redis createCluster) take keys over
// all slots, each delivered twice at once, so the duplicate waits in
// IDEM.CLAIM ... WAIT on the primary that is failed over (Redis answers it
// UNBLOCKED, which the library resends to the new primary; Valkey redirects
// it with MOVED); every 25th work outlives its lease, so only its heartbeat
// keeps it through the failovers; a batch of keys with one hash tag is
// delivered twice too, during the failover of its primary. Each key's work
// runs once, every record ends done, and no error reaches a caller. Module
// only; client.mk runs it once, on Redis 7.0 (IDEM_FAILOVER=1).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import calculateSlot from 'cluster-key-slot';
import { createCluster } from 'redis';
import { Idem } from '../dist/esm/index.js';
import { deliveries, sleep, startCluster } from './helpers.mjs';

const WORKERS = 8;
const MIN_KEYS = 300;
const WORK_MS = 100;
const LEASE_MS = 2000;
const SLOW_WORK_MS = 2500; // every 25th key: longer than the lease, so only the heartbeat keeps it
const TAG = '{batch}';
const skip = process.env.IDEM_FAILOVER === '1' ? false : 'a 6-node cluster: set IDEM_FAILOVER=1 (client.mk runs it on one server)';

let cluster;
before(async () => {
  if (!skip) cluster = await startCluster(3, { replicas: 1 });
});
after(async () => cluster?.stop());

test('a planned failover of every primary: each work runs once, every record done, no error', { skip }, async () => {
  const prefix = `fo:${Date.now()}:`;
  const clients = [];
  for (let i = 0; i < WORKERS + 2; i++) {
    if (i % 2 === 0) clients.push(cluster.client());
    else {
      const nr = createCluster({ rootNodes: cluster.nodes.map((n) => ({ url: n.url })) });
      await nr.connect();
      clients.push(nr);
    }
  }
  const idems = clients.map((c) => new Idem(c, { prefix, lease: LEASE_MS, wait: 30000 }));
  const runs = new Map();
  const errors = [];
  const queue = deliveries();
  const work = async (job) => {
    runs.set(job.key, (runs.get(job.key) ?? 0) + 1);
    await sleep(job.key.startsWith('slow') ? SLOW_WORK_MS : WORK_MS);
    return job.key;
  };
  const worker = async (idem) => {
    for (let key; (key = await queue.take()) !== null; ) {
      try {
        assert.equal((await idem.process(key, work)).value, key);
      } catch (err) {
        errors.push(`${key}: ${err?.name}: ${err?.message}`); // what reached the caller
      }
    }
  };
  const batchKeys = Array.from({ length: 20 }, (_, i) => `${TAG}:${i}`);
  const batchItems = [];
  const batch = async (idem) => {
    try {
      batchItems.push(...(await idem.processMany(batchKeys, work)));
    } catch (err) {
      errors.push(`batch: ${err?.name}: ${err?.message}`);
    }
  };
  let failoversDone = false;
  const fed = [];
  const feed = async () => {
    // a pair of deliveries every 30 ms until the failovers are over
    while (!failoversDone || fed.length < MIN_KEYS) {
      const key = `${fed.length % 25 === 0 ? 'slow' : 'k'}${fed.length}`;
      fed.push(key);
      queue.put(key);
      queue.put(key);
      await sleep(30);
    }
    for (let i = 0; i < WORKERS; i++) queue.put(null);
  };
  const ownerOf = async (key) => {
    const slot = calculateSlot(prefix + key);
    const slots = await clients[0].cluster('SLOTS');
    return slots.find(([from, to]) => slot >= from && slot <= to)[2][1];
  };

  const valkey = (await cluster.serverName()) === 'valkey';
  const woken = (stats) => (stats.UNBLOCKED ?? 0) + (valkey ? (stats.MOVED ?? 0) : 0);
  const wokenBefore = woken(await cluster.errorstats());
  const tasks = [...idems.slice(0, WORKERS).map(worker), feed()];
  const batches = [];
  try {
    while (runs.size < 30) await sleep(10);
    const tagOwner = await ownerOf(batchKeys[0]);
    for (const primary of cluster.primaries) {
      let replica;
      for (const node of cluster.nodes) if ((await cluster.primaryOf(node)) === primary.port) replica = node;
      if (primary.port === tagOwner) {
        // the batch, twice at once, as its primary fails over
        batches.push(...idems.slice(WORKERS).map(batch));
        await sleep(WORK_MS);
      }
      await cluster.failover(replica);
      await sleep(300);
    }
  } finally {
    failoversDone = true;
    await Promise.all([...tasks, ...batches]);
  }

  assert.deepEqual(errors, []);
  // the primaries changed, and waiting claims were woken by it
  assert.ok(woken(await cluster.errorstats()) > wokenBefore, JSON.stringify(await cluster.errorstats()));
  for (const node of cluster.replicas) assert.equal(await cluster.primaryOf(node), undefined);
  assert.ok(fed.length >= MIN_KEYS);
  // a batch's key the other batch held is busy (not waited for): delivered again, it replays
  const statuses = {};
  for (const item of batchItems) statuses[item.status] = (statuses[item.status] ?? 0) + 1;
  assert.equal(statuses.processed, batchKeys.length, JSON.stringify(statuses));
  assert.deepEqual(Object.keys(statuses).filter((s) => !['processed', 'replayed', 'busy'].includes(s)), []);
  for (const item of batchItems) if (item.status === 'busy') assert.equal((await idems[0].process(item.key, work)).value, item.key);
  const everyKey = [...fed, ...batchKeys];
  assert.deepEqual(everyKey.filter((k) => runs.get(k) !== 1).map((k) => [k, runs.get(k)]), []);
  assert.equal(runs.size, everyKey.length);
  const states = {};
  for (const key of everyKey) {
    const state = (await idems[1].get(key))?.state;
    states[state] = (states[state] ?? 0) + 1;
  }
  assert.deepEqual(states, { done: everyKey.length });
  assert.ok(idems.reduce((n, idem) => n + idem.stats.waits, 0) > 0);
  assert.ok(idems.reduce((n, idem) => n + idem.stats.extends, 0) > 0); // the slow works' heartbeats, through the failovers
  for (const [i, idem] of idems.entries()) {
    await idem.close();
    await (i % 2 === 0 ? clients[i].quit() : clients[i].close());
  }
});
