// A minimal redis-idem consumer loop with ioredis.
//
// Usage: node consumer.js redis://127.0.0.1:6379 [messages]
//
// Each message is processed once however often it is delivered: CLAIM
// before the work, DONE after it (with the result to replay), RELEASE when
// the work fails so that a retry can run at once. A copy that arrives while
// another consumer is still working on the message waits for it (WAIT) and
// gets its result, instead of BUSY.
'use strict';
const Redis = require('ioredis');

// How long a copy waits for the one in flight. A waiting command holds its
// connection: give each consumer its own, with no commandTimeout below it.
const WAIT_MS = 5000;

async function handle(redis, businessId, work) {
  const key = `example:node:${businessId}`;
  const [status, value, attempt] = await redis.call('IDEM.CLAIM', key, 30, 'WAIT', WAIT_MS);
  if (status === 'NEW' || status === 'RETRY' || status === 'SEEN') {
    const token = value;
    let result;
    try {
      result = await work(businessId, attempt); // attempt: a fencing number downstream
    } catch (err) {
      await redis.call('IDEM.RELEASE', key, token); // a waiting copy retries at once
      return ['released', null];
    }
    await redis.call('IDEM.DONE', key, token, 'RESULT', result); // wakes the copies waiting
    return ['processed', result];
  }
  // Already done (or done while we waited): acknowledge; value is the result.
  if (status === 'DONE') return ['duplicate', value];
  if (status === 'BUSY') return ['busy', null]; // still at work after WAIT_MS: do not acknowledge
  return ['dead-letter', null]; // MISMATCH or EXHAUSTED
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
  const other = new Redis(url); // a second consumer, on its own connection
  const admin = new Redis(url); // for the demo's look at INFO idem
  const done = [];
  const work = async (businessId) => {
    done.push(businessId);
    return `charged ${businessId}`;
  };
  // The work takes a while: here, until the other copy waits on the server
  // (checked, so that the demo does not depend on timing), or WAIT_MS if it
  // never does.
  const slowWork = async (businessId, attempt) => {
    const deadline = Date.now() + WAIT_MS;
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
        ? [await handle(redis, id, work), await handle(redis, id, work)]
        : await Promise.all([handle(redis, id, slowWork), handle(other, id, slowWork)]);
    for (const [outcome, result] of copies) {
      outcomes[outcome] = (outcomes[outcome] || 0) + 1;
      if (result !== `charged ${id}`) throw new Error(`message ${id}: ${outcome} got ${result}`);
    }
  }
  const waited = (await waits(admin))[1] - waitedBefore;
  await Promise.all([redis.quit(), other.quit(), admin.quit()]);
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
