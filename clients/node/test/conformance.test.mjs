// The conformance cases (clients/conformance/cases.json), read at test
// time, each run through ioredis and through node-redis on real servers:
// IDEM_CONFIGS (comma-separated; all three by default) says which of
// `module` (the module, standalone), `functions` (functions/idem.lua, no
// module) and `cluster` (3 primaries with the module) this run starts, on
// REDIS_SERVER. The configs run side by side (each on its own servers); a
// config's cases run one after the other (`unblock` and `waiting` look at
// every client of the server).
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import express from 'express';
import { Cluster, Redis } from 'ioredis';
import { createClient, createCluster } from 'redis';
import * as lib from '../dist/esm/index.js';
import { repo, signal, sleep, startCluster, startServer } from './helpers.mjs';
import { startProxy } from './proxy.mjs';

const { Idem, IdemError, fingerprint, idempotency, keepRawBody } = lib;
const { cases } = JSON.parse(readFileSync(join(repo, 'clients/conformance/cases.json'), 'utf8'));
const configs = (process.env.IDEM_CONFIGS || 'module,functions,cluster').split(',').filter(Boolean);
const KINDS = ['ioredis', 'node-redis'];
const COUNTERS = ['firstRuns', 'retries', 'replays', 'waits', 'busy', 'completed', 'released', 'leasesLost', 'resultsDropped', 'mismatches', 'exhausted', 'extends'];
const snake = (name) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
let caseNumber = 0;

const applies = (c, config) =>
  config === 'cluster' ? c.topology === 'cluster' : c.topology === 'standalone' && c.editions.includes(config);

/** The instance's options from a case's (durations in ms, as this library takes them). */
function instanceOptions(o = {}) {
  const out = {};
  if (o.lease_ms !== undefined) out.lease = o.lease_ms;
  if (o.wait_ms !== undefined) out.wait = o.wait_ms;
  if (o.heartbeat_ms !== undefined) out.heartbeat = o.heartbeat_ms;
  if (o.max_tries !== undefined) out.maxTries = o.max_tries;
  if (o.oversize !== undefined) out.oversize = o.oversize;
  const fail = () => {
    throw new Error('hook failed');
  };
  if (o.hooks) out.hooks = { ...(o.hooks.on_run === 'raise' ? { onRun: fail } : {}), ...(o.hooks.on_done === 'raise' ? { onDone: fail } : {}) };
  return out;
}

const errorClass = (name) => {
  const cls = lib[`${name}Error`];
  assert.ok(cls, `no error class for ${name}`);
  return cls;
};

function checkError(err, expect, where) {
  assert.ok(err, `${where}: expected the error ${expect.error}`);
  if (expect.error === 'Work') {
    assert.ok(!(err instanceof IdemError), `${where}: expected the work's own error, got ${err}`);
    if (expect.message !== undefined) assert.equal(err.message, expect.message, where);
  } else assert.ok(err instanceof errorClass(expect.error), `${where}: expected ${expect.error}, got ${err?.stack ?? err}`);
  if ('error_result' in expect) assert.deepEqual(err.result, expect.error_result, `${where}: the error's result`);
  if ('lease_left_ms_min' in expect) assert.ok(err.leaseLeft >= expect.lease_left_ms_min, `${where}: leaseLeft ${err.leaseLeft}`);
}

/** One server config: its servers, and a way to open the case's clients. */
async function startConfig(config) {
  if (config === 'cluster') {
    const cluster = await startCluster(3);
    const nodes = cluster.nodes.map((n) => n.ioredis());
    return {
      nodes,
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
  const server = await startServer({ functions: config === 'functions' });
  const nodes = [server.ioredis()];
  return {
    nodes,
    async client(kind, proxy) {
      const port = proxy ? proxy.port : server.port;
      if (kind === 'ioredis') return new Redis({ port, host: '127.0.0.1' });
      const c = createClient({ url: `redis://127.0.0.1:${port}` });
      c.on('error', () => undefined); // a cut connection reconnects
      await c.connect();
      return c;
    },
    admin: () => server.ioredis(),
    port: server.port,
    stop: async () => {
      await Promise.all(nodes.map((n) => n.quit()));
      await server.stop();
    },
  };
}

const closeClient = async (client) => {
  try {
    if (typeof client.quit === 'function' && client instanceof Redis) await client.quit();
    else if (client instanceof Cluster) await client.quit();
    else await (client.close ? client.close() : client.quit());
  } catch {
    // already closed
  }
};

/** The blocked `idem.claim` clients of every node: [node, id]. */
async function blockedClaims(nodes) {
  const out = [];
  for (const node of nodes) {
    const list = await node.call('CLIENT', 'LIST');
    for (const line of list.split('\n')) {
      const f = Object.fromEntries(line.split(' ').map((kv) => kv.split('=')));
      if (f.cmd?.toLowerCase() === 'idem.claim' && f.flags?.includes('b')) out.push([node, f.id]);
    }
  }
  return out;
}

async function until(what, check, ms = 10000) {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting until ${what}`);
    await sleep(10);
  }
}

/** Runs one case's steps on a config with one client kind. */
async function runCase(c, config, env, kind) {
  const prefix = `t${++caseNumber}:`;
  const proxy = c.needs.includes('proxy') ? await startProxy(env.port) : undefined;
  const client = await env.client(kind, proxy);
  const adminClient = env.admin();
  const options = instanceOptions(c.options);
  const idem = new Idem(client, { prefix, ...options });
  const other = new Idem(adminClient, { prefix }); // another worker, and the record's reader
  const tokens = {};
  const gates = {};
  const gate = (name) => (gates[name] ??= signal());
  const calls = {};
  let http;
  const k = (key) => prefix + key;
  if (c.steps.some((s) => s.op === 'command_calls')) await Promise.all(env.nodes.map((n) => n.call('CONFIG', 'RESETSTAT')));

  /** A work from its spec; `seen` tells what it did. */
  const makeWork = (spec, seen) => async (job) => {
    seen.ran = true;
    seen.attempt = job.attempt;
    seen.started.resolve();
    if (spec.gate) await gate(spec.gate).promise;
    if (spec.sleep_ms) await sleep(spec.sleep_ms);
    seen.lost = job.lost;
    if (spec.raise) throw new Error(spec.raise);
    if (spec.return_unserializable) return 10n;
    if (spec.return_bytes) return 'x'.repeat(spec.return_bytes);
    return spec.return;
  };
  const call = (step) => {
    const seen = { ran: false, started: signal() };
    const opts = {};
    if (step.payload !== undefined) opts.payload = step.payload;
    Object.assign(opts, instanceOptions(step.options));
    seen.promise = idem.process(step.key, makeWork(step.work, seen), opts).then(
      (outcome) => ({ outcome }),
      (error) => ({ error }),
    );
    return seen;
  };
  const checkCall = async (seen, expect, where) => {
    const { outcome, error } = await seen.promise;
    if (expect.error) checkError(error, expect, where);
    else if (error) throw error;
    if ('ran' in expect) assert.equal(seen.ran, expect.ran, `${where}: ran`);
    if ('lost_seen' in expect) assert.equal(seen.lost, expect.lost_seen, `${where}: lost_seen`);
    if ('attempt' in expect) assert.equal(outcome ? outcome.attempt : seen.attempt, expect.attempt, `${where}: attempt`);
    if (!outcome) return;
    if ('value' in expect) assert.deepEqual(outcome.value ?? null, expect.value, `${where}: value`);
    if ('replayed' in expect) assert.equal(outcome.replayed, expect.replayed, `${where}: replayed`);
    if ('status' in expect) assert.equal(outcome.status, expect.status, `${where}: status`);
    if ('result_stored' in expect) assert.equal(outcome.resultStored, expect.result_stored, `${where}: result_stored`);
  };
  const checkReply = (reply, expect, where) => {
    if (expect.error) return checkError(reply instanceof Error ? reply : undefined, expect, where);
    assert.ok(!(reply instanceof Error), `${where}: ${reply}`);
    if ('status' in expect) assert.equal(reply.status, expect.status, `${where}: status`);
    if ('attempt' in expect) assert.equal(reply.attempt, expect.attempt, `${where}: attempt`);
    if ('completed' in expect) assert.equal(reply.completed, expect.completed, `${where}: completed`);
  };
  const settled = async (promise) => promise.then((reply) => reply, (error) => error);

  try {
    for (const [n, step] of c.steps.entries()) {
      const where = `step ${n} (${step.op})`;
      const e = step.expect;
      switch (step.op) {
        case 'process':
          await checkCall(call(step), e ?? {}, where);
          break;
        case 'start':
          calls[step.id] = call(step);
          break;
        case 'running':
          await calls[step.id].started.promise;
          break;
        case 'waiting':
          if (config === 'functions') await sleep(300);
          else await until(`${step.id} waits`, async () => (await blockedClaims(env.nodes)).length > 0);
          break;
        case 'finish':
          await checkCall(calls[step.id], e ?? {}, where);
          break;
        case 'open':
          gate(step.gate).resolve();
          break;
        case 'process_many': {
          const seen = {};
          const items = await idem.processMany(step.keys, (job) => makeWork(step.work[job.key], (seen[job.key] = { started: signal() }))(job), step.payloads ? { payloads: step.payloads } : {});
          assert.equal(items.length, e.length, where);
          e.forEach((want, i) => {
            const got = items[i];
            const at = `${where} item ${i}`;
            assert.equal(got.key, want.key, at);
            assert.equal(got.status, want.status, `${at}: status ${got.status} ${got.error?.stack ?? ''}`);
            if ('value' in want) assert.deepEqual(got.value ?? null, want.value, `${at}: value`);
            if ('attempt' in want) assert.equal(got.attempt, want.attempt, `${at}: attempt`);
            if ('result_stored' in want) assert.equal(got.resultStored, want.result_stored, `${at}: result_stored`);
            if (want.error) checkError(got.error, want, at);
          });
          break;
        }
        case 'claim': {
          const reply = await settled(other.claim(step.key, step.lease_ms));
          if (step.as && !(reply instanceof Error)) tokens[step.as] = reply.token;
          if (e) checkReply(reply, e, where);
          break;
        }
        case 'done':
        case 'release': {
          const token = tokens[step.token];
          const reply =
            step.op === 'done'
              ? await settled(other.done(step.key, token, step.result === undefined ? {} : { result: step.result }))
              : await settled(other.release(step.key, token));
          if (e && step.op === 'release') assert.equal(reply, e.released, where);
          else if (e) checkReply(reply, e, where);
          break;
        }
        case 'claim_many': {
          const replies = await idem.claimMany(step.keys, step.lease_ms);
          replies.forEach((reply, i) => {
            if (step.as?.[i] && !(reply instanceof Error)) tokens[step.as[i]] = reply.token;
            if (e) checkReply(reply, e[i], `${where} item ${i}`);
          });
          break;
        }
        case 'done_many':
        case 'release_many': {
          const items = step.items.map(([key, token, result]) => ({ key, token: tokens[token], ...(result === undefined ? {} : { result }) }));
          const replies = step.op === 'done_many' ? await idem.doneMany(items) : await idem.releaseMany(items);
          if (e) replies.forEach((reply, i) => checkReply(reply, e[i], `${where} item ${i}`));
          break;
        }
        case 'get': {
          const record = await other.get(step.key);
          if (e === null) assert.equal(record, null, where);
          else {
            assert.ok(record, `${where}: no record`);
            if ('state' in e) assert.equal(record.state, e.state, `${where}: state`);
            if ('attempt' in e) assert.equal(record.attempt, e.attempt, `${where}: attempt`);
            if ('result' in e) assert.equal(record.result === null ? null : record.result.toString('utf8'), e.result, `${where}: result`);
          }
          break;
        }
        case 'set':
          await adminClient.set(k(step.key), step.value);
          break;
        case 'del':
          await adminClient.del(k(step.key));
          break;
        case 'sleep':
          await sleep(step.ms);
          break;
        case 'unblock':
          for (const [node, id] of await blockedClaims(env.nodes)) await node.call('CLIENT', 'UNBLOCK', id, 'ERROR');
          break;
        case 'cut_reply':
          proxy.arm();
          break;
        case 'command_calls': {
          let sum = 0;
          for (const node of env.nodes) {
            const m = (await node.info('commandstats')).match(new RegExp(`cmdstat_${step.command.replace('.', '\\.')}:calls=(\\d+)`, 'i'));
            sum += m ? Number(m[1]) : 0;
          }
          assert.equal(sum, e, `${where}: ${step.command} calls`);
          break;
        }
        case 'fingerprint':
          assert.equal(fingerprint(step.method, step.target, step.body), e, where);
          break;
        case 'http':
        case 'http_start': {
          http ??= await startApp(client, prefix, gate);
          const request = http.request(step);
          if (step.op === 'http_start') calls[step.id] = request;
          else checkResponse(await request, e ?? {}, http, where);
          break;
        }
        case 'http_finish':
          checkResponse(await calls[step.id], e ?? {}, http, where);
          break;
        case 'handler_finished':
          await until(`the handler finished ${step.count} times`, () => http.finished >= step.count);
          break;
        default:
          throw new Error(`${where}: unknown op`);
      }
    }
    for (const name of COUNTERS) {
      const key = snake(name);
      if (name === 'extends') {
        if ('extends_min' in c.stats) assert.ok(idem.stats.extends >= c.stats.extends_min, `extends ${idem.stats.extends}`);
      } else assert.equal(idem.stats[name], c.stats[key] ?? 0, `stats.${name}: ${JSON.stringify(idem.stats)}`);
    }
  } finally {
    for (const g of Object.values(gates)) g.resolve();
    await Promise.all(Object.values(calls).map((s) => s.promise ?? s.catch?.(() => undefined)));
    await http?.stop();
    await idem.close();
    await closeClient(client);
    await closeClient(adminClient);
    await proxy?.stop();
  }
}

function checkResponse(r, expect, http, where) {
  if ('client_timeout' in expect) assert.equal(r.clientTimeout, expect.client_timeout, `${where}: client_timeout`);
  if ('status' in expect) assert.equal(r.status, expect.status, `${where}: status`);
  if ('replayed' in expect) assert.equal(r.replayed, expect.replayed, `${where}: replayed`);
  if ('body' in expect) assert.equal(r.body, expect.body, `${where}: body`);
  if ('retry_after' in expect) assert.equal(r.retryAfter, expect.retry_after, `${where}: retry_after`);
  if ('handler_runs' in expect) assert.equal(http.runs, expect.handler_runs, `${where}: handler_runs`);
}

/** An Express app whose handler does what each request's step says; the middleware on an instance of its own. */
async function startApp(client, prefix, gate) {
  const middlewares = new Map();
  const state = { runs: 0, finished: 0 };
  const idem = new Idem(client, { prefix });
  await idem.edition(); // asked before the first request, so that a client timeout of 150 ms is met in the handler
  const app = express();
  app.use(express.json({ verify: keepRawBody }));
  app.use((req, res, next) => {
    const options = req.get('x-case-options') ?? '{}';
    if (!middlewares.has(options)) middlewares.set(options, idempotency(idem, instanceOptions(JSON.parse(options))));
    middlewares.get(options)(req, res, next);
  });
  app.use(async (req, res) => {
    const spec = JSON.parse(req.get('x-case-handler'));
    state.runs++;
    if (spec.gate) await gate(spec.gate).promise;
    if (spec.sleep_ms) await sleep(spec.sleep_ms);
    try {
      res.status(spec.status).type('application/json').send(spec.body);
    } finally {
      state.finished++;
    }
  });
  const server = app.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const base = `http://127.0.0.1:${server.address().port}`;
  return Object.assign(state, {
    async request(step) {
      try {
        const res = await fetch(base + step.target, {
          method: step.method,
          body: step.body,
          headers: { 'content-type': 'application/json', ...step.headers, 'x-case-handler': JSON.stringify(step.handler), 'x-case-options': JSON.stringify(step.options ?? {}) },
          signal: step.client_timeout_ms ? AbortSignal.timeout(step.client_timeout_ms) : undefined,
        });
        return { status: res.status, replayed: res.headers.get('idempotent-replayed') === 'true', retryAfter: res.headers.has('retry-after'), body: await res.text(), clientTimeout: false };
      } catch (err) {
        if (err.name === 'TimeoutError' || err.name === 'AbortError') return { clientTimeout: true };
        throw err;
      }
    },
    stop: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(resolve));
    },
  });
}

describe('conformance', { concurrency: true }, () => {
  for (const config of configs) {
    describe(config, { concurrency: 1 }, () => {
      let env;
      before(async () => (env = await startConfig(config)));
      after(() => env?.stop());
      for (const kind of KINDS) {
        for (const c of cases.filter((c) => applies(c, config))) {
          test(`${config} ${kind} ${c.id}`, () => runCase(c, config, env, kind));
        }
      }
    });
  }
});
