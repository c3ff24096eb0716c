// A minimal redis-idem consumer with ioredis and the redis-idem library
// (clients/node).
//
// Usage: node consumer.js redis://127.0.0.1:6379 [messages]
//
// Each message is processed once however often it is delivered:
// idem.process() claims it, runs the work (keeping the lease alive), stores
// the result, replays it for a redelivery, releases the claim when the work
// throws, and makes a copy that arrives while another consumer is still at
// work wait for it (WAIT) and get its result, instead of BUSY.
'use strict';
const Redis = require('ioredis');
const { Idem, BusyError } = require('redis-idem');

async function handle(idem, businessId, work) {
  try {
    const outcome = await idem.process(String(businessId), (job) => work(businessId, job.attempt), { lease: 30000, wait: 5000 });
    return [outcome.replayed ? 'duplicate' : 'processed', outcome.value];
  } catch (err) {
    if (err instanceof BusyError) return ['busy', null]; // still at work after the wait: do not acknowledge
    if (err.name === 'MismatchError' || err.name === 'ExhaustedError') return ['dead-letter', null];
    return ['released', null]; // the work threw: released, a redelivery retries it
  }
}

// The server's count of waits: [waiting now, ended with the holder's DONE].
async function waits(redis) {
  const info = Object.fromEntries(
    (await redis.info('idem')).split('\r\n').filter((line) => line.includes(':')).map((line) => line.split(':')),
  );
  const count = (how) => Number(info[`idem_wait_${how}`]);
  const ended = ['claimed', 'done', 'timeout', 'unblocked'].reduce((sum, how) => sum + count(how), 0);
  return [count('started') - ended, count('done')];
}

async function main() {
  const url = process.argv[2] || 'redis://127.0.0.1:6379';
  const messages = Number(process.argv[3] || 20);
  const redis = new Redis(url);
  const idem = new Idem(redis, { prefix: 'example:node:' }); // two consumers below share it
  const admin = new Redis(url); // for the demo's look at INFO idem
  const done = [];
  const work = async (businessId) => {
    done.push(businessId);
    return `charged ${businessId}`;
  };
  // The work takes a while: here, until the other copy waits on the server
  // (checked, so that the demo does not depend on timing), or 5 s if it
  // never does.
  const slowWork = async (businessId, attempt) => {
    const deadline = Date.now() + 5000;
    while ((await waits(admin))[0] === 0 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 1));
    }
    return work(businessId, attempt);
  };
  const outcomes = {};
  const waitedBefore = (await waits(admin))[1];
  // Every message is delivered twice, as at-least-once queues do: the odd
  // ones one copy after the other (the second finds DONE), the even ones to
  // two consumers at once (one works, the other waits for its result).
  for (let id = 0; id < messages; id++) {
    const copies =
      id % 2
        ? [await handle(idem, id, work), await handle(idem, id, work)]
        : await Promise.all([handle(idem, id, slowWork), handle(idem, id, slowWork)]);
    for (const [outcome, result] of copies) {
      outcomes[outcome] = (outcomes[outcome] || 0) + 1;
      if (result !== `charged ${id}`) throw new Error(`message ${id}: ${outcome} got ${result}`);
    }
  }
  const waited = (await waits(admin))[1] - waitedBefore;
  await idem.close(); // the connections it opened for WAIT
  await Promise.all([redis.quit(), admin.quit()]);
  console.log(`node: processed=${outcomes.processed || 0} duplicates=${outcomes.duplicate || 0} waited=${waited}`);
  if (done.length !== messages || outcomes.processed !== messages || outcomes.duplicate !== messages) {
    console.error('each message must be worked on exactly once', outcomes);
    process.exit(1);
  }
  if (waited !== Math.ceil(messages / 2)) {
    console.error('each copy that arrived in flight must have waited for the first one', waited);
    process.exit(1);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
