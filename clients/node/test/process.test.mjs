// The consumer loop, process() and wrap(), through both clients, on the
// module: first runs and replays (hooks and counters), RELEASE on a throw,
// MISMATCH / EXHAUSTED / BUSY, waiting for the copy in flight, the size
// policy, prefixes, serialisers; a worker killed mid-work (a child process)
// and a lapsed lease (a second worker takes over, the first's DONE is
// refused); and processBatch over MCLAIM / MDONE / MRELEASE.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import {
  BusyError,
  ExhaustedError,
  LeaseLostError,
  MismatchError,
  ResultNotStoredError,
  StaleError,
  raw,
} from '../dist/esm/index.js';
import { connect, signal, sleep, startServer } from './helpers.mjs';

let server;
before(async () => (server = await startServer()));
after(() => server.stop());

for (const kind of ['ioredis', 'node-redis']) {
  describe(kind, () => {
    const opened = [];
    const open = async (options = {}) => {
      const idem = await connect(kind, server, { prefix: `${kind}:`, ...options });
      opened.push(idem);
      return idem;
    };
    after(() => Promise.all(opened.map((i) => i.end())));

    test('a first run, then replays: the work runs once, hooks and counters tell them apart', async () => {
      const seen = [];
      const idem = await open({ hooks: { onFirstRun: (i) => seen.push(['first', i.attempt, i.status]), onReplay: (i) => seen.push(['replay', i.attempt]) } });
      let runs = 0;
      const work = async (ctx) => {
        runs++;
        return { charged: 12.5, attempt: ctx.attempt };
      };
      const first = await idem.process('p1', work);
      assert.deepEqual(first.value, { charged: 12.5, attempt: 1 });
      assert.equal(first.replayed, false);
      assert.equal(first.status, 'NEW');
      assert.equal(first.resultStored, true);
      assert.equal(first.done.code, 1);
      const second = await idem.process('p1', work);
      assert.equal(second.replayed, true);
      assert.deepEqual(second.value, { charged: 12.5, attempt: 1 });
      assert.equal(runs, 1);
      assert.deepEqual(seen, [['first', 1, 'NEW'], ['replay', 1]]);
      assert.equal(idem.stats.firstRuns, 1);
      assert.equal(idem.stats.replays, 1);
      assert.equal((await idem.get('p1')).state, 'done');
    });

    test('a throw releases the claim and rethrows; the next call is a RETRY with attempt 2', async () => {
      const idem = await open();
      const released = [];
      idem.hooks.onRelease = (i) => released.push(i.attempt);
      await assert.rejects(idem.process('p2', () => Promise.reject(new Error('downstream down'))), /downstream down/);
      assert.equal((await idem.get('p2')).state, 'released');
      assert.deepEqual(released, [1]);
      const retry = await idem.process('p2', (ctx) => `${ctx.status} ${ctx.attempt}`);
      assert.equal(retry.value, 'RETRY 2');
      assert.equal(retry.attempt, 2);
      assert.equal(idem.stats.released, 1);
    });

    test('MISMATCH and EXHAUSTED throw their errors', async () => {
      const idem = await open();
      await idem.process('p3', () => 'ok', { payload: 'body A' });
      await assert.rejects(idem.process('p3', () => 'other', { payload: 'body B' }), MismatchError);
      await assert.rejects(idem.process('p4', () => { throw new Error('fails'); }, { maxTries: 1 }), /fails/);
      await assert.rejects(idem.process('p4', () => 'never', { maxTries: 1 }), (e) => e instanceof ExhaustedError && e.attempt === 1);
      assert.equal(idem.stats.mismatches, 1);
      assert.equal(idem.stats.exhausted, 1);
    });

    test('a copy in flight: the duplicate waits (WAIT) and replays its result; the work runs once', async () => {
      const a = await open();
      const b = await open(); // WAIT holds its connection: the duplicate has its own
      const started = signal();
      let runs = 0;
      const slow = async () => {
        runs++;
        started.resolve();
        await sleep(300);
        return 'the result';
      };
      const first = a.process('p5', slow);
      await started.promise;
      const duplicate = await b.process('p5', slow, { waitMs: 5000 });
      assert.equal((await first).value, 'the result');
      assert.equal(duplicate.replayed, true);
      assert.equal(duplicate.waited, true);
      assert.equal(duplicate.value, 'the result');
      assert.equal(runs, 1);
    });

    test('still BUSY when the wait ends: BusyError, with the lease left', async () => {
      const a = await open();
      const b = await open();
      const started = signal();
      const release = signal();
      const first = a.process('p6', async () => {
        started.resolve();
        await release.promise;
        return 1;
      });
      await started.promise;
      await assert.rejects(b.process('p6', () => 2, { waitMs: 150 }), (e) => e instanceof BusyError && e.leaseMs > 20000);
      assert.equal(b.stats.busy, 1);
      release.resolve();
      assert.equal((await first).value, 1);
    });

    test('a result over idem.max-result still completes the record, without the result', async () => {
      const oversize = [];
      const idem = await open({ maxResult: 50, hooks: { onOversize: (i) => oversize.push(i.bytes) } });
      const big = 'x'.repeat(100);
      const first = await idem.process('p7', () => big);
      assert.equal(first.value, big);
      assert.equal(first.resultStored, false);
      assert.equal(first.done.code, 1);
      assert.deepEqual(oversize, [102]);
      const replay = await idem.process('p7', () => assert.fail('must not run again'));
      assert.equal(replay.replayed, true);
      assert.equal(replay.resultStored, false);
      assert.equal(replay.value, undefined);
      // wrap() cannot hand back a value it does not have
      const wrapped = idem.wrap(() => big, { key: () => 'p7' });
      await assert.rejects(wrapped(), ResultNotStoredError);
      // a policy may store something smaller instead
      const pointer = await open({ maxResult: 50, oversize: (bytes) => JSON.stringify({ tooLarge: bytes.length }) });
      await pointer.process('p8', () => big);
      assert.deepEqual((await pointer.process('p8', () => null)).value, { tooLarge: 102 });
    });

    test("the server's own limit is found with CONFIG GET, and a DONE refused for size completes without it", async () => {
      const idem = await open();
      await idem.raw('CONFIG', 'SET', 'idem.max-result', '64');
      try {
        const outcome = await idem.process('p9', () => 'y'.repeat(80));
        assert.equal(outcome.resultStored, false);
        assert.equal((await idem.get('p9')).state, 'done');
        const stale = await open({ maxResult: 1000 }); // believes the limit is higher than it is
        const second = await stale.process('p10', () => 'y'.repeat(80));
        assert.equal(second.resultStored, false);
        assert.equal((await stale.get('p10')).state, 'done');
      } finally {
        await idem.raw('CONFIG', 'SET', 'idem.max-result', '1048576');
      }
    });

    test('prefixes keep tenants apart; serialisers are pluggable', async () => {
      const t1 = await open({ prefix: `${kind}:tenant1:` });
      const t2 = await open({ prefix: `${kind}:tenant2:` });
      assert.equal((await t1.process('order:1', () => 'one')).replayed, false);
      assert.equal((await t2.process('order:1', () => 'two')).replayed, false);
      assert.equal((await t1.process('order:1', () => 'x')).value, 'one');
      assert.equal((await t1.get('order:1')).state, 'done');
      const bytes = await open({ serializer: raw });
      await bytes.process('bin', () => Buffer.from([1, 2, 3]));
      assert.deepEqual((await bytes.process('bin', () => Buffer.alloc(0))).value, Buffer.from([1, 2, 3]));
    });

    test('wrap(): the function runs once per key however often it is called', async () => {
      const idem = await open();
      let runs = 0;
      const charge = idem.wrap(
        async (ctx, orderId, amount) => {
          runs++;
          return { orderId, amount, attempt: ctx.attempt };
        },
        { key: (orderId) => `charge:${orderId}`, payload: (orderId, amount) => `${amount}` },
      );
      assert.deepEqual(await charge('A1', 10), { orderId: 'A1', amount: 10, attempt: 1 });
      assert.deepEqual(await charge('A1', 10), { orderId: 'A1', amount: 10, attempt: 1 });
      await assert.rejects(charge('A1', 99), MismatchError);
      assert.equal(runs, 1);
    });

    test('a worker killed mid-work: its lease lapses and the next worker runs it as a RETRY', async () => {
      const worker = spawn(process.execPath, [fileURLToPath(new URL('./worker.mjs', import.meta.url)), server.url, `${kind}:killed`, '1', kind], {
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      const [line] = await once(worker.stdout, 'data');
      assert.equal(line.toString().trim(), 'working 1');
      worker.kill('SIGKILL');
      await once(worker, 'exit');
      const idem = await open();
      const outcome = await idem.process('killed', (ctx) => `${ctx.status} ${ctx.attempt}`, { waitMs: 5000 });
      assert.equal(outcome.value, 'RETRY 2'); // WAIT woke it when the dead worker's lease lapsed
      assert.equal(outcome.waited, true);
      assert.equal((await idem.get('killed')).attempt, 2);
    });

    test("a lapsed lease: a second worker takes over, the first one's DONE is refused", async () => {
      const a = await open();
      const b = await open();
      const aStarted = signal();
      const bStarted = signal();
      const aFinished = signal();
      const lost = [];
      a.hooks.onLeaseLost = (i) => lost.push(i.attempt);
      // a: a 1-second lease and no heartbeat (a worker paused past its lease)
      const first = a.process(
        'lapsed',
        async () => {
          aStarted.resolve();
          await bStarted.promise;
          return 'from a';
        },
        { lease: 1, heartbeat: false },
      );
      await aStarted.promise;
      const second = b.process(
        'lapsed',
        async (ctx) => {
          bStarted.resolve();
          await aFinished.promise;
          return `from b, attempt ${ctx.attempt}`;
        },
        { waitMs: 5000 },
      );
      await assert.rejects(first, (e) => e instanceof LeaseLostError && e instanceof StaleError && e.attempt === 1);
      aFinished.resolve();
      assert.equal((await second).value, 'from b, attempt 2');
      assert.deepEqual(lost, [1]);
      assert.equal(a.stats.leaseLost, 1);
      const record = await b.get('lapsed');
      assert.equal(record.attempt, 2);
      assert.equal(JSON.parse(record.result), 'from b, attempt 2');
    });

    test('the heartbeat notices a lost claim: the signal aborts and process() throws LeaseLostError', async () => {
      const idem = await open();
      const other = await open();
      const result = idem.process(
        'taken',
        async (ctx) => {
          await other.raw('DEL', `${kind}:taken`); // an operator deletes the record...
          await other.claim('taken', 30); // ...and someone else claims it
          await new Promise((resolve) => ctx.signal.addEventListener('abort', resolve));
          return 'late';
        },
        { lease: 3, heartbeat: 100 },
      );
      await assert.rejects(result, LeaseLostError);
    });

    test('processBatch: one MCLAIM, the work for the granted keys, one MDONE and one MRELEASE', async () => {
      const idem = await open();
      await idem.process('batch:done', () => 'earlier');
      const holder = await idem.claim('batch:busy', 30);
      const outcomes = await idem.processBatch(['batch:a', 'batch:done', 'batch:fail', 'batch:busy', 'batch:b'], async (ctx) => {
        if (ctx.key === 'batch:fail') throw new Error('no');
        return `${ctx.key} ${ctx.attempt}`;
      });
      assert.deepEqual(
        outcomes.map((o) => [o.key, o.status, o.value]),
        [
          ['batch:a', 'processed', 'batch:a 1'],
          ['batch:done', 'replayed', 'earlier'],
          ['batch:fail', 'failed', undefined],
          ['batch:busy', 'busy', undefined],
          ['batch:b', 'processed', 'batch:b 1'],
        ],
      );
      assert.equal((await idem.get('batch:fail')).state, 'released');
      assert.deepEqual((await idem.get('batch:a')).result, Buffer.from('"batch:a 1"'));
      await idem.release('batch:busy', holder.token);
      const again = await idem.processBatch(['batch:a', 'batch:fail'], (ctx) => `again ${ctx.attempt}`);
      assert.deepEqual(again.map((o) => [o.status, o.value]), [['replayed', 'batch:a 1'], ['processed', 'again 2']]);
    });
  });
}
