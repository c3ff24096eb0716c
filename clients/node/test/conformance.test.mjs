// The conformance cases (clients/conformance/cases.json), read at test
// time, each run through ioredis and through node-redis on real servers
// (conformance-run.mjs maps each step to the API). IDEM_CONFIGS
// (comma-separated) says which configs this run starts, on REDIS_SERVER:
// `module`, `functions` (functions/idem.lua, no module), `cluster` (3
// primaries with the module), `replicated` and `replicated-functions` (a
// primary and its replica), `sentinel` and `sentinel-functions` (the same
// watched by a Sentinel); all of them by default. The configs run side by
// side (each on its own servers); a config's cases run one after the other
// (`unblock` and `waiting` look at every client of the server). Every case
// whose edition and topology a config has runs there: none is skipped (the
// library has every `needs`: the middleware and the proxy).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { configOf, startConfig } from './conformance-env.mjs';
import { runCase } from './conformance-run.mjs';
import { repo } from './helpers.mjs';

const { cases } = JSON.parse(readFileSync(join(repo, 'clients/conformance/cases.json'), 'utf8'));
const ALL = 'module,functions,cluster,replicated,replicated-functions,sentinel,sentinel-functions';
const configs = (process.env.IDEM_CONFIGS || ALL).split(',').filter(Boolean);
const KINDS = ['ioredis', 'node-redis'];

const applies = (c, config) => {
  const { topology, edition } = configOf(config);
  return c.topology === topology && c.editions.includes(edition);
};

describe('conformance', { concurrency: true }, () => {
  for (const config of configs) {
    describe(config, { concurrency: 1 }, () => {
      let env;
      before(async () => (env = await startConfig(config)));
      after(() => env?.stop());
      for (const kind of KINDS) {
        for (const c of cases.filter((c) => applies(c, config))) {
          test(`${config} ${kind} ${c.id}`, () => runCase(c, env, kind));
        }
      }
    });
  }
});
