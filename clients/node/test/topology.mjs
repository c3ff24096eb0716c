// A primary with one replica, and the same watched by one Sentinel
// (REDIS_SERVER run with --sentinel: Debian's redis-server and Valkey's
// binary both are Sentinels that way), on free 127.0.0.1 ports, for the
// `replicated` and `sentinel` topologies of the conformance cases and the
// Sentinel failover test. `functions: true`: functions/idem.lua on the
// primary (the replica gets it by replication), no module.
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { createSentinel } from 'redis';
import { freePort, sleep, spawnServer, startServer } from './helpers.mjs';

export const MASTER = 'mymaster';

/** Waits until `check()` is true (polling every 50 ms), or throws after `ms`. */
export async function until(what, check, ms = 30000) {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await sleep(50);
  }
}

/** INFO replication as an object. */
export async function replication(admin) {
  return Object.fromEntries((await admin.info('replication')).split('\r\n').filter((l) => l.includes(':')).map((l) => l.split(/:(.*)/s).slice(0, 2)));
}

/** `replica` lists `primary` as its primary with the link up, and `primary` lists it online at its own offset. */
async function inSync(primary, primaryAdmin, replicaAdmin) {
  const r = await replication(replicaAdmin);
  if (r.role !== 'slave' || r.master_link_status !== 'up' || Number(r.master_port) !== primary.port) return false;
  const p = await replication(primaryAdmin);
  return Object.entries(p).some(([k, v]) => /^slave\d+$/.test(k) && v.includes('state=online') && v.includes(`offset=${p.master_repl_offset},`));
}

/**
 * `replica` in sync and acknowledging: listed online, a replica after a
 * full sync may take up to a second (its first ACK) before the primary
 * streams it commands (Redis 7's diskless sync): until then a WAIT times
 * out, and a failover promotes a replica without the writes made meanwhile.
 */
async function attached(primary, primaryAdmin, replicaAdmin) {
  await until('the replica is in sync', () => inSync(primary, primaryAdmin, replicaAdmin));
  await acknowledged(primaryAdmin);
}

/** Until the primary's replica acknowledges a write made on it now (SET, then WAIT on the same connection). */
async function acknowledged(primaryAdmin) {
  await until('the replica acknowledges a write', async () => {
    await primaryAdmin.set('topology:attached', String(Date.now()));
    return (await primaryAdmin.call('WAIT', 1, 2000)) >= 1;
  });
}

/** A primary and one replica of it, in sync. `detach()`: the replica stops acknowledging; `attach()`: it is a replica again, in sync. */
export async function startReplicated({ functions = false } = {}) {
  // no 5 s wait before a full sync (the replica's first, and each re-attach)
  const primary = await startServer({ functions, args: ['--repl-diskless-sync-delay', '0'] });
  const replica = await startServer({ functions: false, module: !functions, args: ['--replicaof', '127.0.0.1', String(primary.port)] });
  const primaryAdmin = primary.ioredis();
  const replicaAdmin = replica.ioredis();
  await attached(primary, primaryAdmin, replicaAdmin);
  return {
    primary,
    replica,
    primaryAdmin,
    replicaAdmin,
    async detach() {
      await replicaAdmin.call('REPLICAOF', 'NO', 'ONE');
      await until('the primary sees its replica gone', async () => (await replication(primaryAdmin)).connected_slaves === '0');
    },
    async attach() {
      await replicaAdmin.call('REPLICAOF', '127.0.0.1', String(primary.port));
      await attached(primary, primaryAdmin, replicaAdmin);
    },
    async stop() {
      await Promise.all([primaryAdmin.quit(), replicaAdmin.quit()]);
      await Promise.all([replica.stop(), primary.stop()]);
    },
  };
}

/** A Sentinel process watching `port` as MASTER with quorum 1. */
async function startSentinelProcess(port) {
  const sentinelPort = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'redis-idem-sentinel-'));
  const conf = join(dir, 'sentinel.conf');
  writeFileSync(
    conf,
    [
      `port ${sentinelPort}`,
      'bind 127.0.0.1',
      `dir ${dir}`,
      `sentinel monitor ${MASTER} 127.0.0.1 ${port} 1`,
      `sentinel down-after-milliseconds ${MASTER} 2000`,
      `sentinel failover-timeout ${MASTER} 20000`,
      '',
    ].join('\n'),
  );
  const spawned = await spawnServer([conf, '--sentinel'], sentinelPort, dir);
  return { port: sentinelPort, log: spawned.log, stop: spawned.stop };
}

/**
 * A primary, one replica and one Sentinel. `ioredis()` and `nodeRedis()`
 * make clients through the Sentinel; `failover()` is SENTINEL FAILOVER once
 * the replica acknowledged a write, waited for until the Sentinel names the
 * other server, it answers ROLE as master and the old primary is its replica
 * with the link up, acknowledging.
 */
export async function startSentinel({ functions = false } = {}) {
  const pair = await startReplicated({ functions });
  const servers = [pair.primary, pair.replica];
  const admins = [pair.primaryAdmin, pair.replicaAdmin];
  const sentinel = await startSentinelProcess(pair.primary.port);
  const sentinelAdmin = new Redis({ port: sentinel.port, host: '127.0.0.1' });
  const masterPort = async () => Number((await sentinelAdmin.call('SENTINEL', 'get-master-addr-by-name', MASTER))[1]);
  const sentinels = [{ host: '127.0.0.1', port: sentinel.port }];
  // the Sentinel knows the replica (it reads it from the primary's INFO)
  await until('the Sentinel knows the replica', async () => (await sentinelAdmin.call('SENTINEL', 'replicas', MASTER)).length === 1);
  return {
    servers,
    admins,
    sentinel,
    sentinelAdmin,
    masterPort,
    ioredis(options = {}) {
      const client = new Redis({ sentinels, name: MASTER, ...options });
      client.on('error', () => undefined); // reconnecting through a failover (and after the Sentinel stopped)
      return client;
    },
    async nodeRedis(options = {}) {
      const client = createSentinel({ name: MASTER, sentinelRootNodes: sentinels, ...options });
      client.on('error', () => undefined); // a failover closes connections; commands are resent or fail on their own
      await client.connect();
      return client;
    },
    async failover() {
      const before = await masterPort();
      const next = servers.find((s) => s.port !== before);
      const nextAdmin = admins[servers.indexOf(next)];
      const oldAdmin = admins[servers.findIndex((s) => s.port === before)];
      // The replica has everything the case wrote: a Sentinel failover promotes the replica as it
      // is (asynchronous replication, which the case is not about), and what it never acknowledged is lost.
      await acknowledged(oldAdmin);
      for (;;) {
        try {
          await sentinelAdmin.call('SENTINEL', 'FAILOVER', MASTER);
          break;
        } catch (err) {
          if (!/NOGOODSLAVE|INPROG/.test(err.message)) throw err;
          await sleep(200); // the replica's state is not fresh enough yet
        }
      }
      await until('the Sentinel names the new primary', async () => (await masterPort()) === next.port);
      await until('the new primary answers ROLE as master', async () => (await nextAdmin.call('ROLE'))[0] === 'master');
      await until('the old primary is its replica with the link up', async () => {
        const r = await replication(oldAdmin);
        return r.role === 'slave' && Number(r.master_port) === next.port && r.master_link_status === 'up';
      });
      await attached(next, nextAdmin, oldAdmin);
    },
    async stop() {
      sentinelAdmin.disconnect(); // a Sentinel knows no QUIT
      await sentinel.stop();
      await pair.stop();
    },
  };
}
