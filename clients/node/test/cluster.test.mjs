// A 3-node Redis Cluster with the module, started by the test, through
// ioredis Cluster: commands routed by their key (ioredis does not know the
// module's commands; the library sets each one's slot), process() on keys
// in every node, and batches split by slot; and the same through
// node-redis's createCluster.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import calculateSlot from 'cluster-key-slot';
import { Idem } from '../dist/esm/index.js';
import { signal, sleep, startCluster } from './helpers.mjs';

let cluster;
let client;
let idem;
before(async () => {
  cluster = await startCluster(3);
  client = cluster.client();
  idem = new Idem(client, { prefix: 'c:' });
});
after(async () => {
  await idem.close();
  await client.quit();
  await cluster.stop();
});

/** The node port that holds each key's slot, from the cluster's own slot map. */
async function owners(keys) {
  const slots = await client.cluster('SLOTS');
  return keys.map((key) => {
    const slot = calculateSlot(key);
    return slots.find(([from, to]) => slot >= from && slot <= to)[2][1];
  });
}

test('the edition is found, and each key is processed on the node owning its slot', async () => {
  assert.equal(await idem.edition(), 'module');
  const keys = Array.from({ length: 30 }, (_, i) => `k${i}`);
  const ports = new Set(await owners(keys.map((k) => `c:${k}`)));
  assert.equal(ports.size, 3, 'the keys span all three nodes');
  for (const key of keys) {
    const outcome = await idem.process(key, (ctx) => `${key}@${ctx.attempt}`);
    assert.equal(outcome.value, `${key}@1`);
    assert.equal((await idem.process(key, () => 'again')).value, `${key}@1`);
  }
  // every command went straight to its node: no node answered MOVED
  for (const node of cluster.nodes) {
    const direct = node.ioredis();
    const errors = await direct.info('errorstats');
    await direct.quit();
    assert.doesNotMatch(errors, /errorstat_MOVED/, `port ${node.port}: ${errors}`);
  }
  // each record is on the node that owns its slot, asked directly
  const { Redis } = await import('ioredis');
  const portsByKey = await owners(keys.map((k) => `c:${k}`));
  for (const [i, key] of keys.entries()) {
    const node = new Redis({ port: portsByKey[i], host: '127.0.0.1' });
    assert.equal(await node.call('EXISTS', `c:${key}`), 1);
    await node.quit();
  }
});

test('a duplicate waits (WAIT) on the key’s node for the copy in flight', async () => {
  const started = signal();
  const first = idem.process('w1', async () => {
    started.resolve();
    await sleep(200);
    return 'first';
  });
  await started.promise;
  const second = await idem.process('w1', () => 'second', { wait: 5000 });
  assert.equal(second.value, 'first');
  assert.equal(second.waited, true);
  assert.equal((await first).value, 'first');
});

test('MCLAIM / MDONE split by slot (and in order), over all three nodes', async () => {
  const keys = Array.from({ length: 300 }, (_, i) => `batch:${i}`);
  const claims = await idem.mclaim(keys, 30000);
  assert.equal(claims.length, 300);
  assert.ok(claims.every((c) => c.status === 'NEW'), claims.find((c) => c.status !== 'NEW'));
  const done = await idem.mdone(keys.map((key, i) => ({ key, token: claims[i].token, result: `"${key}"` })));
  assert.ok(done.every((d) => d.code === 1));
  const again = await idem.mclaim(keys, 30000);
  again.forEach((reply, i) => {
    assert.equal(reply.status, 'DONE');
    assert.equal(reply.result.toString(), `"${keys[i]}"`);
  });
  // keys sharing a hash tag go in one call; the outcome is the same
  const tagged = Array.from({ length: 50 }, (_, i) => `{tenant7}:${i}`);
  const outcomes = await idem.processMany(tagged, (job) => job.key.length);
  assert.ok(outcomes.every((o) => o.status === 'processed'));
  assert.equal((await idem.get('{tenant7}:49')).state, 'done');
});

test('concurrent calls share one MCLAIM per slot (one queue per slot), each with its own answer', async () => {
  const nodes = cluster.nodes.map((n) => n.ioredis());
  try {
    await idem.edition(); // batches start once the edition is known
    await Promise.all(nodes.map((n) => n.call('CONFIG', 'RESETSTAT')));
    const keys = ['{x}', '{y}', '{z}'].flatMap((tag) => Array.from({ length: 20 }, (_, i) => `${tag}:${i}`));
    assert.equal(new Set(await owners(keys.map((k) => `c:${k}`))).size >= 2, true, 'the tags span two nodes or more');
    const outcomes = await Promise.all(keys.map((key) => idem.process(key, (job) => job.key)));
    assert.deepEqual(outcomes.map((o) => o.value), keys);
    assert.ok(outcomes.every((o) => !o.replayed && o.attempt === 1));
    let mclaims = 0;
    for (const node of nodes) mclaims += Number((await node.info('commandstats')).match(/cmdstat_idem\.mclaim:calls=(\d+)/i)?.[1] ?? 0);
    assert.ok(mclaims >= 1 && mclaims < keys.length, `${mclaims} MCLAIMs for ${keys.length} calls`);
  } finally {
    await Promise.all(nodes.map((n) => n.quit()));
  }
});

test('scan() finds the records of every primary; requeue() goes to the key’s node', async () => {
  const keys = Array.from({ length: 30 }, (_, i) => `scan:${i}`);
  assert.equal(new Set(await owners(keys.map((k) => `c:${k}`))).size, 3, 'the keys span all three nodes');
  for (const key of keys) await idem.claim(key, 60000);
  const listed = [];
  for await (const key of idem.scan({ match: 'scan:*', state: 'processing' })) listed.push(key);
  assert.deepEqual([...new Set(listed)].sort(), [...keys].sort());
  assert.equal(await idem.once('scan:marked', 60000), true);
  assert.equal(await idem.requeue('scan:marked'), true);
  assert.equal((await idem.get('scan:marked')).state, 'released');
});

test('node-redis createCluster: process() and batches routed by slot the same way', async () => {
  const { createCluster } = await import('redis');
  const nr = createCluster({ rootNodes: cluster.nodes.map((n) => ({ url: n.url })) });
  await nr.connect();
  const nIdem = new Idem(nr, { prefix: 'nr:' });
  try {
    for (let i = 0; i < 20; i++) {
      assert.equal((await nIdem.process(`k${i}`, () => i)).value, i);
      assert.equal((await nIdem.process(`k${i}`, () => -1)).replayed, true);
    }
    const keys = Array.from({ length: 200 }, (_, i) => `b${i}`);
    const outcomes = await nIdem.processMany(keys, (job) => job.key);
    assert.ok(outcomes.every((o, i) => o.status === 'processed' && o.value === keys[i]));
    const again = await nIdem.mclaim(keys, 30000);
    assert.ok(again.every((r, i) => r.status === 'DONE' && r.result.toString() === JSON.stringify(keys[i])));
    const started = signal();
    const first = nIdem.process('w', async () => {
      started.resolve();
      await sleep(200);
      return 'first';
    });
    await started.promise;
    const second = await nIdem.process('w', () => 'second', { wait: 5000 });
    assert.equal(second.value, 'first');
    assert.equal(second.waited, true);
    await first;
    const listed = [];
    for await (const key of nIdem.scan({ match: 'k*', state: 'done' })) listed.push(key);
    assert.deepEqual([...new Set(listed)].sort(), Array.from({ length: 20 }, (_, i) => `k${i}`).sort());
  } finally {
    await nIdem.close();
    await nr.close();
  }
});
