// The servers of one conformance config and the clients each case opens:
// `module` and `functions` (one server), `cluster` (3 primaries with the
// module), `replicated` / `replicated-functions` (a primary and its
// replica; the library talks to the primary) and `sentinel` /
// `sentinel-functions` (the same watched by a Sentinel; the library is
// made from its client's Sentinel support).
import { Cluster, Redis } from 'ioredis';
import { createClient, createCluster } from 'redis';
import { startCluster, startServer } from './helpers.mjs';
import { startReplicated, startSentinel } from './topology.mjs';

/** A config's edition and topology. */
export function configOf(config) {
  const [topology, edition] = {
    module: ['standalone', 'module'],
    functions: ['standalone', 'functions'],
    cluster: ['cluster', 'module'],
    replicated: ['replicated', 'module'],
    'replicated-functions': ['replicated', 'functions'],
    sentinel: ['sentinel', 'module'],
    'sentinel-functions': ['sentinel', 'functions'],
  }[config] ?? [];
  if (!topology) throw new Error(`unknown config ${config}`);
  return { topology, edition };
}

export async function closeClient(client) {
  try {
    if (client instanceof Redis || client instanceof Cluster) await client.quit();
    else await (client.close ? client.close() : client.quit());
  } catch {
    // already closed
  }
}

async function nodeRedisClient(url) {
  const c = createClient({ url });
  c.on('error', () => undefined); // a cut connection reconnects
  await c.connect();
  return c;
}

/** One config's servers, and a way to open the case's clients. */
export async function startConfig(config) {
  const { topology, edition } = configOf(config);
  const functions = edition === 'functions';
  if (topology === 'cluster') {
    const cluster = await startCluster(3);
    const nodes = cluster.nodes.map((n) => n.ioredis());
    return {
      edition,
      nodes,
      primaries: () => nodes,
      async client(kind) {
        if (kind === 'ioredis') return cluster.client();
        const c = createCluster({ rootNodes: cluster.nodes.map((n) => ({ url: n.url })) });
        await c.connect();
        return c;
      },
      admin: () => cluster.client(),
      stop: async () => {
        await Promise.all(nodes.map((n) => n.quit()));
        await cluster.stop();
      },
    };
  }
  if (topology === 'replicated') {
    const pair = await startReplicated({ functions });
    let detached = false;
    return {
      edition,
      nodes: [pair.primaryAdmin, pair.replicaAdmin],
      primaries: () => [pair.primaryAdmin],
      client: (kind) => (kind === 'ioredis' ? pair.primary.ioredis() : nodeRedisClient(pair.primary.url)),
      admin: () => pair.primary.ioredis(),
      replicaClient: () => pair.replica.ioredis(),
      async replica(action) {
        if (action === 'detach') await pair.detach();
        else await pair.attach();
        detached = action === 'detach';
      },
      async restore() {
        if (detached) await this.replica('attach');
      },
      stop: () => pair.stop(),
    };
  }
  if (topology === 'sentinel') {
    const watched = await startSentinel({ functions });
    return {
      edition,
      nodes: watched.admins,
      async primaries() {
        const port = await watched.masterPort();
        return [watched.admins[watched.servers.findIndex((s) => s.port === port)]];
      },
      client: (kind) => (kind === 'ioredis' ? watched.ioredis() : watched.nodeRedis()),
      admin: () => watched.ioredis(),
      failover: () => watched.failover(),
      stop: () => watched.stop(),
    };
  }
  const server = await startServer({ functions });
  const nodes = [server.ioredis()];
  return {
    edition,
    nodes,
    primaries: () => nodes,
    port: server.port,
    client(kind, proxy) {
      const port = proxy ? proxy.port : server.port;
      return kind === 'ioredis' ? new Redis({ port, host: '127.0.0.1' }) : nodeRedisClient(`redis://127.0.0.1:${port}`);
    },
    admin: () => server.ioredis(),
    stop: async () => {
      await Promise.all(nodes.map((n) => n.quit()));
      await server.stop();
    },
  };
}
