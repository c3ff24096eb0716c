// The heartbeat keeps a 30-second job alive under a 2-second lease. It
// takes 30 s of wall time whatever the server, and what it proves (the
// library's timer sending EXTEND) does not depend on the server, so
// client.mk runs this file on one server only (Redis 7.0), to keep
// `make test` within its budget; the quick tests run on all three.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { connect, sleep, startServer } from '../helpers.mjs';

let server;
before(async () => (server = await startServer()));
after(() => server.stop());

// The two clients' jobs run at once: one 30-second wait for both.
describe('heartbeat', { concurrency: true }, () => {
for (const kind of ['ioredis', 'node-redis']) {
  test(`${kind}: a 30-second job under a 2-second lease stays claimed, and completes`, async () => {
    const worker = await connect(kind, server);
    const other = await connect(kind, server);
    try {
      const job = worker.process(
        `long:${kind}`,
        async (job) => {
          // Meanwhile a redelivery keeps finding the key BUSY: the lease never lapses.
          const end = Date.now() + 30000;
          let probes = 0;
          while (Date.now() < end) {
            await sleep(2500);
            const claim = await other.claim(`long:${kind}`, 2000);
            assert.equal(claim.status, 'BUSY', `probe ${probes}: the lease lapsed`);
            assert.ok(claim.leaseLeft > 0 && claim.leaseLeft <= 2000);
            probes++;
          }
          assert.equal(job.lost, false);
          return probes;
        },
        { lease: 2000 },
      );
      const outcome = await job;
      assert.ok(outcome.value >= 11, `${outcome.value} probes`);
      assert.equal(outcome.resultStored, true);
      assert.equal(outcome.attempt, 1);
      assert.ok(worker.stats.extends >= 40, `${worker.stats.extends} EXTENDs`);
      assert.equal((await other.get(`long:${kind}`)).state, 'done');
    } finally {
      await worker.end();
      await other.end();
    }
  });
}
});
