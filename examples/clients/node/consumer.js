// A minimal redis-idem consumer loop with ioredis.
//
// Usage: node consumer.js redis://127.0.0.1:6379 [messages]
//
// Each message is processed once however often it is delivered: CLAIM
// before the work, DONE after it (with the result to replay), RELEASE when
// the work fails so that a retry can run at once.
'use strict';
const Redis = require('ioredis');

async function handle(redis, businessId, work) {
  const key = `example:node:${businessId}`;
  const [status, value, attempt] = await redis.call('IDEM.CLAIM', key, 30);
  if (status === 'NEW' || status === 'RETRY' || status === 'SEEN') {
    const token = value;
    let result;
    try {
      result = await work(businessId, attempt); // attempt: a fencing number downstream
    } catch (err) {
      await redis.call('IDEM.RELEASE', key, token); // the next delivery retries
      return 'released';
    }
    await redis.call('IDEM.DONE', key, token, 'RESULT', result);
    return 'processed';
  }
  if (status === 'DONE') return 'duplicate'; // acknowledge; value is the stored result
  if (status === 'BUSY') return 'busy'; // do not acknowledge; it comes back later
  return 'dead-letter'; // MISMATCH or EXHAUSTED
}

async function main() {
  const url = process.argv[2] || 'redis://127.0.0.1:6379';
  const messages = Number(process.argv[3] || 20);
  const redis = new Redis(url);
  const done = [];
  const work = async (businessId) => {
    done.push(businessId);
    return `charged ${businessId}`;
  };
  const outcomes = {};
  // Every message is delivered twice, as at-least-once queues do.
  for (const round of [0, 1]) {
    for (let id = 0; id < messages; id++) {
      const outcome = await handle(redis, id, work);
      outcomes[outcome] = (outcomes[outcome] || 0) + 1;
    }
  }
  await redis.quit();
  console.log(`node: processed=${outcomes.processed || 0} duplicates=${outcomes.duplicate || 0}`);
  if (done.length !== messages || outcomes.processed !== messages || outcomes.duplicate !== messages) {
    console.error('each message must be worked on exactly once', outcomes);
    process.exit(1);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
