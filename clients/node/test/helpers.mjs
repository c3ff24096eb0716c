// Real servers for the tests, on free 127.0.0.1 ports, started and stopped
// by the tests themselves:
//   REDIS_SERVER        the server binary (redis-server, or valkey-server)
//   REDIS_IDEM_MODULE   the module (<repo>/target/release/libredis_idem.so)
//   REDIS_IDEM_FUNCTIONS the Functions library (<repo>/functions/idem.lua)
// startServer({ functions: true }) starts one without the module, with
// functions/idem.lua loaded: the Functions edition.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Redis, Cluster } from 'ioredis';
import { createClient } from 'redis';
import { Idem } from '../dist/esm/index.js';

export const repo = resolve(dirname(fileURLToPath(import.meta.url)), '../../..');
export const serverBinary = process.env.REDIS_SERVER || 'redis-server';
export const modulePath = process.env.REDIS_IDEM_MODULE || join(repo, 'target/release/libredis_idem.so');
export const functionsPath = process.env.REDIS_IDEM_FUNCTIONS || join(repo, 'functions/idem.lua');
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let nextPort = 20000 + Math.floor(Math.random() * 9000);

/** A port free now, whose cluster bus port (+10000) is free too. */
export async function freePort() {
  const free = (port) =>
    new Promise((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(false));
      s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
    });
  for (;;) {
    const port = nextPort++;
    if (nextPort > 29999) nextPort = 20000;
    if ((await free(port)) && (await free(port + 10000))) return port;
  }
}

/** The process_id the server on `port` reports (null: none answers yet). */
export async function serverPid(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1');
    let text = '';
    socket.setTimeout(1000, () => {
      socket.destroy();
      resolve(null);
    });
    socket.once('error', () => resolve(null));
    socket.once('connect', () => socket.write('INFO server\r\n'));
    socket.on('data', (d) => {
      text += d;
      const found = /process_id:(\d+)\r\n/.exec(text);
      if (found || text.startsWith('-')) {
        socket.destroy();
        resolve(found ? Number(found[1]) : null);
      }
    });
  });
}

/**
 * Starts a server: with the module; `{ functions: true }`: without it, with
 * functions/idem.lua loaded; `{ functions: true, module: true }`: both;
 * `{ module: false }`: neither.
 */
export async function startServer({ functions = false, module = !functions, cluster = false, args = [] } = {}) {
  let port, spawned;
  for (let tries = 1; !spawned; tries++) {
    port = await freePort();
    const dir = mkdtempSync(join(tmpdir(), 'redis-idem-node-'));
    const argv = ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, ...args];
    if (module) argv.push('--loadmodule', modulePath);
    if (cluster) argv.push('--cluster-enabled', 'yes', '--cluster-config-file', join(dir, 'nodes.conf'), '--cluster-node-timeout', '5000');
    try {
      spawned = await spawnServer(argv, port, dir);
    } catch (e) {
      rmSync(dir, { recursive: true, force: true });
      if (tries === 5) throw e; // else a port taken between freePort() and the server's bind: another
    }
  }
  const server = {
    port,
    url: `redis://127.0.0.1:${port}`,
    log: spawned.log,
    ioredis: (options = {}) => new Redis({ port, host: '127.0.0.1', lazyConnect: false, ...options }),
    stop: spawned.stop,
  };
  if (functions) {
    const admin = server.ioredis();
    await admin.call('FUNCTION', 'LOAD', 'REPLACE', readFileSync(functionsPath, 'utf8'));
    await admin.quit();
  }
  return server;
}

/**
 * REDIS_SERVER run with `argv`, answering on `port` (or killed, with
 * its log in the error); `stop()` ends it and removes `dir`.
 */
export async function spawnServer(argv, port, dir) {
  const child = spawn(serverBinary, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  child.stdout.on('data', (d) => (log += d));
  child.stderr.on('data', (d) => (log += d));
  const exited = new Promise((r) => child.once('exit', r));
  const deadline = Date.now() + 10000;
  // Our pid, not a PING: another suite's server can take the port first,
  // and ours exits while theirs answers.
  for (let pid; (pid = await serverPid(port)) !== child.pid; await sleep(20)) {
    if (pid !== null || child.exitCode !== null || Date.now() > deadline) {
      child.kill('SIGKILL');
      await exited;
      throw new Error(`${serverBinary} ${argv.join(' ')} did not start on port ${port}:\n${log}`);
    }
  }
  return {
    log: () => log,
    async stop() {
      child.kill('SIGTERM');
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A queue of deliveries, as a broker's: `put(item)`; `take()` waits for the next (null: no more). */
export function deliveries() {
  const items = [];
  const waiting = [];
  return {
    put(item) {
      const taker = waiting.shift();
      if (taker) taker(item);
      else items.push(item);
    },
    take: () => (items.length ? Promise.resolve(items.shift()) : new Promise((r) => waiting.push(r))),
  };
}

/** Both clients on one server, each with its Idem: [['ioredis', idem, client], ['node-redis', idem, client]]. */
export async function bothClients(server, options = {}) {
  const io = server.ioredis();
  const nr = createClient({ url: server.url });
  await nr.connect();
  const made = [
    ['ioredis', new Idem(io, options), io],
    ['node-redis', new Idem(nr, options), nr],
  ];
  made.close = async () => {
    await io.quit();
    await nr.quit();
  };
  return made;
}

/**
 * A cluster of `n` primaries with the module, its slots spread evenly, each
 * with `replicas` replicas (the module loaded on them too) in sync.
 * `failover(replica)` is a planned failover (`CLUSTER FAILOVER`), waited for.
 */
export async function startCluster(n = 3, { replicas = 0 } = {}) {
  const nodes = [];
  for (let i = 0; i < n * (1 + replicas); i++) nodes.push(await startServer({ cluster: true }));
  const admins = nodes.map((node) => node.ioredis());
  const per = Math.ceil(16384 / n);
  await Promise.all(admins.slice(0, n).map((a, i) => a.call('CLUSTER', 'ADDSLOTSRANGE', i * per, Math.min(16383, (i + 1) * per - 1))));
  for (let i = 1; i < nodes.length; i++) await admins[i].call('CLUSTER', 'MEET', '127.0.0.1', nodes[0].port);
  const everyNode = async (ok, what) => {
    for (const deadline = Date.now() + 30000; ; await sleep(50)) {
      const infos = await Promise.all(admins.map((a) => a.call('CLUSTER', 'INFO')));
      const shards = await Promise.all(admins.map((a) => a.call('CLUSTER', 'NODES')));
      if (infos.every((info, i) => ok(info, shards[i]))) return;
      if (Date.now() > deadline) throw new Error(`${what}:\n${infos.join('\n')}`);
    }
  };
  const known = (info, shards) => shards.trim().split('\n').length === nodes.length;
  await everyNode(known, 'the nodes did not meet');
  for (let i = n; i < nodes.length; i++) await admins[i].call('CLUSTER', 'REPLICATE', await admins[i % n].call('CLUSTER', 'MYID'));
  const ok = (info, shards) => info.includes('cluster_state:ok') && known(info, shards);
  await everyNode(ok, 'the cluster did not form');
  const replication = async (admin) => Object.fromEntries((await admin.info('replication')).split('\r\n').map((l) => l.split(':')));
  const inSync = async (admin) => {
    const r = await replication(admin);
    return r.role === 'slave' && r.master_link_status === 'up' && r.master_sync_in_progress === '0';
  };
  const until = async (test, what) => {
    for (const deadline = Date.now() + 30000; !(await test()); await sleep(50)) if (Date.now() > deadline) throw new Error(what);
  };
  for (let i = n; i < nodes.length; i++) await until(() => inSync(admins[i]), `replica ${nodes[i].port} did not sync`);
  return {
    nodes,
    primaries: nodes.slice(0, n),
    replicas: nodes.slice(n),
    /** The port of `node`'s primary (undefined: it is a primary). */
    primaryOf: async (node) => Number((await replication(admins[nodes.indexOf(node)])).master_port) || undefined,
    async failover(replica) {
      const admin = admins[nodes.indexOf(replica)];
      const oldPort = Number((await replication(admin)).master_port);
      await admin.call('CLUSTER', 'FAILOVER');
      await until(async () => (await replication(admin)).role === 'master', 'the failover did not happen');
      const oldAdmin = admins[nodes.findIndex((node) => node.port === oldPort)];
      await until(() => inSync(oldAdmin), 'the old primary did not become a replica in sync');
      await everyNode(ok, 'the cluster is not ok after the failover');
    },
    /** Error replies counted by the servers (INFO errorstats), summed over the nodes: { MOVED: 3, ... }. */
    async errorstats() {
      const totals = {};
      for (const admin of admins) {
        for (const [, code, count] of (await admin.info('errorstats')).matchAll(/errorstat_(\w+):count=(\d+)/g)) {
          totals[code] = (totals[code] ?? 0) + Number(count);
        }
      }
      return totals;
    },
    serverName: async () => /server_name:valkey/.test(await admins[0].info('server')) ? 'valkey' : 'redis',
    client: (options = {}) => new Cluster(nodes.map((node) => ({ host: '127.0.0.1', port: node.port })), options),
    async stop() {
      await Promise.all(admins.map((a) => a.quit()));
      await Promise.all(nodes.map((node) => node.stop()));
    },
  };
}

/** A new connection of `kind` ('ioredis' or 'node-redis') with its Idem; `.end()` closes both. */
export async function connect(kind, server, options = {}) {
  let client;
  if (kind === 'ioredis') client = server.ioredis();
  else {
    client = createClient({ url: server.url });
    await client.connect();
  }
  const idem = new Idem(client, options);
  idem.client = client;
  idem.raw = (...args) => (kind === 'ioredis' ? client.call(...args) : client.sendCommand(args.map(String)));
  idem.end = async () => {
    await idem.close(); // its WAIT connections
    await client.quit();
  };
  return idem;
}

/** A promise and its resolve. */
export function signal() {
  let resolve;
  const promise = new Promise((r) => (resolve = r));
  return { promise, resolve };
}
