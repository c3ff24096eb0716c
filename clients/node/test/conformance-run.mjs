// One conformance case (clients/conformance/README.md) run through this
// library with one client kind on a config's servers (conformance-env.mjs):
// each step mapped to the API, each expectation checked.
import assert from 'node:assert/strict';
import { hostname } from 'node:os';
import * as lib from '../dist/esm/index.js';
import { closeClient } from './conformance-env.mjs';
import { startApp, checkResponse } from './conformance-http.mjs';
import { signal, sleep } from './helpers.mjs';
import { startProxy } from './proxy.mjs';

const { Idem, IdemError, fingerprint } = lib;
const COUNTERS = ['firstRuns', 'retries', 'replays', 'waits', 'busy', 'completed', 'released', 'leasesLost', 'resultsDropped', 'mismatches', 'exhausted', 'extends', 'notDurable'];
const HOOKS = { on_run: 'onRun', on_replay: 'onReplay', on_busy: 'onBusy', on_done: 'onDone', on_release: 'onRelease', on_lease_lost: 'onLeaseLost', on_result_dropped: 'onResultDropped' };
const snake = (name) => name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
const DEFAULT_OWNER = `${hostname()}:${process.pid}`;
let caseNumber = 0;

/** The instance's options from a case's (durations in ms, as this library takes them); `calls` counts every hook. */
export function instanceOptions(o = {}, calls) {
  const out = {};
  if (o.lease_ms !== undefined) out.lease = o.lease_ms;
  if (o.wait_ms !== undefined) out.wait = o.wait_ms;
  if (o.heartbeat_ms !== undefined) out.heartbeat = o.heartbeat_ms;
  if (o.max_tries !== undefined) out.maxTries = o.max_tries;
  if (o.oversize !== undefined) out.oversize = o.oversize;
  if (o.owner !== undefined) out.owner = o.owner;
  if (o.durable !== undefined) out.durable = { replicas: o.durable.replicas, timeout: o.durable.timeout_ms, fsync: o.durable.fsync };
  if (calls || o.hooks) {
    out.hooks = {};
    for (const [name, hook] of Object.entries(HOOKS)) {
      const raises = o.hooks?.[name] === 'raise';
      if (!calls && !raises) continue;
      out.hooks[hook] = () => {
        if (calls) calls[name] = (calls[name] ?? 0) + 1;
        if (raises) throw new Error('hook failed');
      };
    }
  }
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
    assert.ok(!(err instanceof IdemError), `${where}: expected the work's own error, got ${err?.stack ?? err}`);
    if (expect.message !== undefined) assert.equal(err.message, expect.message, where);
  } else assert.ok(err instanceof errorClass(expect.error), `${where}: expected ${expect.error}, got ${err?.stack ?? err}`);
  if ('error_result' in expect) assert.deepEqual(err.result, expect.error_result, `${where}: the error's result`);
  if ('lease_left_ms_min' in expect) assert.ok(err.leaseLeft >= expect.lease_left_ms_min, `${where}: leaseLeft ${err.leaseLeft}`);
  if ('owner' in expect) assert.equal(err.owner, expect.owner, `${where}: the holder's owner`);
  if ('stage' in expect) assert.equal(err.stage, expect.stage, `${where}: stage`);
}

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
export async function runCase(c, env, kind) {
  const prefix = `t${++caseNumber}:`;
  const proxy = c.needs.includes('proxy') ? await startProxy(env.port) : undefined;
  const client = await env.client(kind, proxy);
  const adminClient = env.admin();
  const hookCalls = {};
  const idem = new Idem(client, { prefix, ...instanceOptions(c.options, hookCalls) });
  const other = new Idem(adminClient, { prefix }); // another worker, and the record's reader
  let replicaClient;
  const tokens = {};
  const gates = {};
  const gate = (name) => (gates[name] ??= signal());
  const calls = {};
  let waitings = 0; // the waiting steps so far
  let http;
  if (c.steps.some((s) => s.op === 'command_calls')) await Promise.all((await env.primaries()).map((n) => n.call('CONFIG', 'RESETSTAT')));

  /** A work from its spec; `seen` tells what it did. */
  const makeWork = (spec, seen) => async (job) => {
    seen.ran = true;
    seen.attempt = job.attempt;
    seen.jobKey = job.key;
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
    const opts = instanceOptions(step.options);
    if (step.payload !== undefined) opts.payload = step.payload;
    // `typed`: Node's typed form is the plain object the JSON codec gives back, as a first run returns it.
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
    if ('job_key' in expect) assert.equal(seen.jobKey, expect.job_key, `${where}: job_key`);
    if ('attempt' in expect) assert.equal(outcome ? outcome.attempt : seen.attempt, expect.attempt, `${where}: attempt`);
    if (!outcome) return;
    if ('value' in expect) assert.deepEqual(outcome.value ?? null, expect.value, `${where}: value`);
    if ('replayed' in expect) assert.equal(outcome.replayed, expect.replayed, `${where}: replayed`);
    if ('status' in expect) assert.equal(outcome.status, expect.status, `${where}: status`);
    if ('result_stored' in expect) assert.equal(outcome.resultStored, expect.result_stored, `${where}: result_stored`);
  };
  const checkReply = (reply, expect, where) => {
    if (expect.error) return checkError(reply instanceof Error ? reply : undefined, expect, where);
    assert.ok(!(reply instanceof Error), `${where}: ${reply?.stack ?? reply}`);
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
          // The Functions edition has no blocked client to see: a call counts its wait at its first BUSY answer.
          if (env.edition === 'functions') {
            const n = ++waitings;
            await until(`${step.id} waits`, () => idem.stats.waits >= n);
          } else await until(`${step.id} waits`, async () => (await blockedClaims(env.nodes)).length > 0);
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
          const reply = await settled(other.claim(step.key, step.lease_ms, step.owner === undefined ? {} : { owner: step.owner }));
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
          let reader = other;
          if (step.on === 'replica') reader = new Idem((replicaClient ??= env.replicaClient()), { prefix });
          const record = await reader.get(step.key);
          if (e === null) assert.equal(record, null, where);
          else {
            assert.ok(record, `${where}: no record`);
            if ('state' in e) assert.equal(record.state, e.state, `${where}: state`);
            if ('attempt' in e) assert.equal(record.attempt, e.attempt, `${where}: attempt`);
            if ('result' in e) assert.equal(record.result === null ? null : record.result.toString('utf8'), e.result, `${where}: result`);
            if ('owner' in e) assert.equal(record.owner, e.owner === '$default' ? DEFAULT_OWNER : e.owner, `${where}: owner`);
          }
          break;
        }
        case 'set':
          await adminClient.set(prefix + step.key, step.value);
          break;
        case 'del':
          await adminClient.del(prefix + step.key);
          break;
        case 'sleep':
          await sleep(step.ms);
          break;
        case 'unblock':
          for (const [node, id] of await blockedClaims(env.nodes)) await node.call('CLIENT', 'UNBLOCK', id, 'ERROR');
          break;
        case 'cut_reply':
        case 'cut_request':
          proxy.cut(step.op === 'cut_reply' ? 'reply' : 'request', step.command, step.times ?? 1);
          break;
        case 'command_calls': {
          let sum = 0;
          for (const node of await env.primaries()) {
            const m = (await node.info('commandstats')).match(new RegExp(`cmdstat_${step.command.replace('.', '\\.')}:calls=(\\d+)`, 'i'));
            sum += m ? Number(m[1]) : 0;
          }
          if ('expect' in step) assert.equal(sum, e, `${where}: ${step.command} calls`);
          if ('expect_max' in step) assert.ok(sum <= step.expect_max, `${where}: ${step.command} calls ${sum} > ${step.expect_max}`);
          break;
        }
        case 'replica':
          await env.replica(step.action);
          break;
        case 'failover':
          await env.failover();
          break;
        case 'fingerprint':
          assert.equal(fingerprint(step.method, step.target, step.body), e, where);
          break;
        case 'http':
        case 'http_start': {
          http ??= await startApp(client, prefix, gate, instanceOptions);
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
    for (const [name, count] of Object.entries(c.hooks_called ?? {})) assert.equal(hookCalls[name] ?? 0, count, `hooks_called.${name}: ${JSON.stringify(hookCalls)}`);
  } finally {
    for (const g of Object.values(gates)) g.resolve();
    await Promise.all(Object.values(calls).map((s) => s.promise ?? s.catch?.(() => undefined)));
    await http?.stop();
    await idem.close();
    await closeClient(client);
    await closeClient(adminClient);
    if (replicaClient) await closeClient(replicaClient);
    await proxy?.stop();
    await env.restore?.();
  }
}
