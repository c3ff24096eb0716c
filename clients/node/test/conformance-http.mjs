// The HTTP steps of the conformance cases: an Express app whose handler
// does what each request's step says, the middleware on an instance of its
// own, and the check of a response.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import express from 'express';
import { Idem, idempotency, keepRawBody } from '../dist/esm/index.js';
import { sleep } from './helpers.mjs';

export function checkResponse(r, expect, http, where) {
  if ('client_timeout' in expect) assert.equal(r.clientTimeout, expect.client_timeout, `${where}: client_timeout`);
  if ('status' in expect) assert.equal(r.status, expect.status, `${where}: status`);
  if ('replayed' in expect) assert.equal(r.replayed, expect.replayed, `${where}: replayed`);
  if ('body' in expect) assert.equal(r.body, expect.body, `${where}: body`);
  if ('retry_after' in expect) assert.equal(r.retryAfter, expect.retry_after, `${where}: retry_after`);
  if ('handler_runs' in expect) assert.equal(http.runs, expect.handler_runs, `${where}: handler_runs`);
}

/** `instanceOptions` maps a step's options to the middleware's (durations in ms). */
export async function startApp(client, prefix, gate, instanceOptions) {
  const middlewares = new Map();
  // onRun: called as a handler starts (a client timeout counts from then:
  // on a loaded machine a request can take longer than 150 ms to arrive).
  const state = { runs: 0, finished: 0, onRun: [] };
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
    for (const f of state.onRun.splice(0)) f();
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
      let abort;
      if (step.client_timeout_ms) {
        const controller = new AbortController();
        state.onRun.push(() => setTimeout(() => controller.abort(), step.client_timeout_ms));
        abort = controller.signal;
      }
      try {
        const res = await fetch(base + step.target, {
          method: step.method,
          body: step.body,
          headers: { 'content-type': 'application/json', ...step.headers, 'x-case-handler': JSON.stringify(step.handler), 'x-case-options': JSON.stringify(step.options ?? {}) },
          signal: abort,
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
