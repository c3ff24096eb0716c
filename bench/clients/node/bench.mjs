// The Node library's loop against the hand-made pair and AWS Powertools,
// as bench/clients/README.md defines the program: one instance, one client,
// N workers (promises) taking the next message index, 200 warm-up messages
// under P + "warm:", the timed part's wall time as the last line of stdout.
//
// --client ioredis|node-redis picks the client of idem and pair (default
// ioredis); powertools always runs on node-redis, the client its
// CachePersistenceLayer's `set(key, value, { EX, NX })` is written for.
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import { Redis } from 'ioredis';
import { createClient } from 'redis';
import { Idem } from 'redis-idem';

const { values: o } = parseArgs({
  options: {
    url: { type: 'string', default: 'redis://127.0.0.1:6379' },
    impl: { type: 'string', default: 'idem' },
    scenario: { type: 'string', default: 'first' },
    inflight: { type: 'string', default: '1' },
    messages: { type: 'string', default: '2000' },
    prefix: { type: 'string', default: `bench:${process.pid}:` },
    edition: { type: 'string', default: 'module' },
    batch: { type: 'string' },
    client: { type: 'string', default: 'ioredis' },
  },
});
const inflight = Number(o.inflight);
const messages = Number(o.messages);
if (!['idem', 'pair', 'powertools'].includes(o.impl)) throw new Error(`--impl idem|pair|powertools (got ${o.impl})`);
if (!['first', 'replay'].includes(o.scenario)) throw new Error(`--scenario first|replay (got ${o.scenario})`);

const work = (i) => ({ n: i });

async function connect(kind) {
  if (kind === 'ioredis') return { client: new Redis(o.url), close: (c) => c.quit() };
  const client = createClient({ url: o.url });
  client.on('error', () => undefined);
  await client.connect();
  return { client, close: (c) => c.close() };
}

/** One message's handling, by implementation: `first` and `replay`, each (key, i) => Promise. */
async function implementation() {
  if (o.impl === 'idem') {
    const { client, close } = await connect(o.client);
    const options = { edition: o.edition };
    if (o.batch !== undefined) options.batch = o.batch === 'on';
    const idem = new Idem(client, options);
    const one = (key, i) => idem.process(key, () => work(i));
    return { first: one, replay: one, close: async () => (await idem.close(), await close(client)) };
  }
  if (o.impl === 'pair') {
    const { client, close } = await connect(o.client);
    const io = o.client === 'ioredis';
    const setNx = io
      ? (key, token) => client.set(key, token, 'PX', 30000, 'NX')
      : (key, token) => client.set(key, token, { PX: 30000, NX: true });
    const setXx = io
      ? (key, value) => client.set(key, value, 'EX', 86400, 'XX')
      : (key, value) => client.set(key, value, { EX: 86400, XX: true });
    const first = async (key, i) => {
      if ((await setNx(key, randomBytes(16).toString('hex'))) === 'OK') {
        const value = work(i);
        await setXx(key, JSON.stringify(value));
        return value;
      }
      return JSON.parse(await client.get(key));
    };
    const replay = async (key) => JSON.parse(await client.get(key));
    return { first, replay, close: () => close(client) };
  }
  const { makeIdempotent, IdempotencyConfig } = await import('@aws-lambda-powertools/idempotency');
  const { CachePersistenceLayer } = await import('@aws-lambda-powertools/idempotency/cache');
  const { client, close } = await connect('node-redis');
  const persistenceStore = new CachePersistenceLayer({ client });
  const config = new IdempotencyConfig({ eventKeyJmesPath: 'key' });
  // Outside Lambda there is no invocation deadline: a context whose time
  // never runs short gives the in-progress record its expiry (without one
  // Powertools warns on every call).
  config.registerLambdaContext({ getRemainingTimeInMillis: () => 300000 });
  const fn = makeIdempotent(async (message) => work(message.i), { persistenceStore, keyPrefix: `${o.prefix}pt`, config });
  const one = (key, i) => fn({ key, i });
  return { first: one, replay: one, close: () => close(client) };
}

async function run(one, prefix, count) {
  let next = 0;
  const worker = async () => {
    while (next < count) {
      const i = next++;
      await one(prefix + i, i);
    }
  };
  await Promise.all(Array.from({ length: inflight }, worker));
}

const impl = await implementation();
// Warm-up: connections, JIT, imports; first runs, then their replays.
await run(impl.first, `${o.prefix}warm:`, 200);
await run(impl.replay, `${o.prefix}warm:`, 200);
const start = process.hrtime.bigint();
const cpuStart = process.cpuUsage();
await run(o.scenario === 'first' ? impl.first : impl.replay, o.prefix, messages);
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
const cpu = process.cpuUsage(cpuStart);
await impl.close();
// `cpu`: this process's user + system CPU seconds over the timed part (less sensitive than `seconds` to a busy machine)
console.log(JSON.stringify({ seconds, messages, cpu: (cpu.user + cpu.system) / 1e6 }));
