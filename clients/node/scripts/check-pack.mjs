// `npm pack`, then install the tarball into a scratch project, as a user
// would, and load it both ways: import (ESM) and require (CJS), and
// type-check a TypeScript file of each kind against its declarations.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const scratch = mkdtempSync(join(tmpdir(), 'redis-idem-pack-'));
const run = (cmd, args, cwd = scratch) => execFileSync(cmd, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'] });
try {
  // --ignore-scripts: dist/ as built already (make test-client-node builds it first); a
  // second build in `prepare` took half this check's time.
  const packed = JSON.parse(run('npm', ['pack', '--json', '--ignore-scripts', '--pack-destination', scratch], root));
  const tarball = join(scratch, packed[0].filename);
  const files = packed[0].files.map((f) => f.path);
  for (const needed of ['dist/esm/index.js', 'dist/esm/index.d.ts', 'dist/cjs/index.js', 'dist/cjs/index.d.ts', 'dist/cjs/package.json', 'README.md', 'CHANGELOG.md']) {
    if (!files.includes(needed)) throw new Error(`the package lacks ${needed}`);
  }
  if (files.some((f) => f.startsWith('test/') || f.startsWith('node_modules/'))) throw new Error('the package ships its tests or node_modules');
  writeFileSync(join(scratch, 'package.json'), '{ "name": "scratch", "private": true }\n');
  run('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', '--loglevel=error', tarball]);
  const esm = run('node', ['--input-type=module', '-e',
    "import { Idem, idempotency, idemModule, StaleError, ClaimStatus } from 'redis-idem'; console.log(typeof Idem, typeof idempotency, typeof idemModule.claim, new StaleError('STALE x') instanceof Error, ClaimStatus.NEW)"]);
  const cjs = run('node', ['-e',
    "const { Idem, idempotency, idemModule, StaleError, ClaimStatus } = require('redis-idem'); console.log(typeof Idem, typeof idempotency, typeof idemModule.claim, new StaleError('STALE x') instanceof Error, ClaimStatus.NEW)"]);
  for (const [how, out] of [['ESM', esm], ['CJS', cjs]]) {
    if (out.trim() !== 'function function object true NEW') throw new Error(`${how} import gave: ${out}`);
  }
  const streams = [
    run('node', ['--input-type=module', '-e', "import { StreamConsumer, KEY_FIELD } from 'redis-idem/streams'; console.log(typeof StreamConsumer, KEY_FIELD)"]),
    run('node', ['-e', "const { StreamConsumer, KEY_FIELD } = require('redis-idem/streams'); console.log(typeof StreamConsumer, KEY_FIELD)"]),
  ];
  if (streams.some((out) => out.trim() !== 'function idem-key')) throw new Error(`redis-idem/streams gave: ${streams.join(' / ')}`);
  // redis-idem/amqp loads without amqplib (it only types the channel it is given)
  const amqp = run('node', ['--input-type=module', '-e', "import { AmqpConsumer, RETRIES_HEADER } from 'redis-idem/amqp'; console.log(typeof AmqpConsumer, RETRIES_HEADER)"]);
  if (amqp.trim() !== 'function x-idem-retries') throw new Error(`redis-idem/amqp gave: ${amqp}`);
  // redis-idem/kafka loads without kafkajs, both ways (it only types the payloads it is given)
  const kafka = [
    run('node', ['--input-type=module', '-e', "import { KafkaIdem, recordKey } from 'redis-idem/kafka'; console.log(typeof KafkaIdem, recordKey({ message: { key: Buffer.from('k') } }))"]),
    run('node', ['-e', "const { KafkaIdem, recordKey } = require('redis-idem/kafka'); console.log(typeof KafkaIdem, recordKey({ message: { key: Buffer.from('k') } }))"]),
  ];
  if (kafka.some((out) => out.trim() !== 'function k')) throw new Error(`redis-idem/kafka gave: ${kafka.join(' / ')}`);
  // The declarations, both ways (node16 resolution picks the exports map's types per condition).
  const use = "const idem = new Idem({} as never, { prefix: 't:' });\nconst p: Promise<Outcome<number>> = idem.process('k', (ctx) => ctx.attempt);\nvoid p;\n";
  writeFileSync(join(scratch, 'check.mts'), `import { Idem, type Outcome } from 'redis-idem';\n${use}`);
  writeFileSync(join(scratch, 'check.cts'), `import type { Outcome } from 'redis-idem';\nimport rid = require('redis-idem');\nconst { Idem } = rid;\n${use}`);
  const tsc = join(root, 'node_modules/typescript/bin/tsc');
  run('node', [tsc, '--noEmit', '--strict', '--module', 'node16', '--moduleResolution', 'node16', '--types', 'node',
    '--typeRoots', join(root, 'node_modules/@types'), 'check.mts', 'check.cts']);
  console.log(`npm pack: ${packed[0].filename} (${files.length} files) installs, and imports as ESM and CJS with its types`);
} finally {
  rmSync(scratch, { recursive: true, force: true });
}
