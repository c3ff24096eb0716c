// A worker the loop tests kill mid-work: it claims the key given, prints
// "working <attempt>", and never finishes. Usage: node worker.mjs url key lease client
import { createClient } from 'redis';
import { Redis } from 'ioredis';
import { Idem } from '../dist/esm/index.js';

const [url, key, lease, kind] = process.argv.slice(2);
let client;
if (kind === 'node-redis') {
  client = createClient({ url });
  await client.connect();
} else client = new Redis(url);
const idem = new Idem(client);
await idem.process(
  key,
  (ctx) => {
    console.log(`working ${ctx.attempt}`);
    return new Promise(() => {}); // killed before it ends
  },
  { lease: Number(lease) },
);
