// Builds dist/esm (ES modules) and dist/cjs (CommonJS) with tsc, each with
// its declarations; dist/cjs gets a package.json saying it is CommonJS.
import { execFileSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);
let tsc;
try {
  tsc = require.resolve('typescript/bin/tsc');
} catch {
  console.error('redis-idem: typescript is missing: run `npm install` in clients/node first (it installs the dev dependencies)');
  process.exit(1);
}
rmSync(join(root, 'dist'), { recursive: true, force: true });
for (const config of ['tsconfig.json', 'tsconfig.cjs.json']) {
  try {
    execFileSync(process.execPath, [tsc, '-p', join(root, config)], { stdio: 'inherit', cwd: root });
  } catch {
    console.error(`redis-idem: tsc -p ${config} failed`);
    process.exit(1);
  }
}
mkdirSync(join(root, 'dist/cjs'), { recursive: true });
writeFileSync(join(root, 'dist/cjs/package.json'), '{ "type": "commonjs" }\n');
