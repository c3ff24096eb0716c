// Builds dist/esm (ES modules) and dist/cjs (CommonJS) with tsc, each with
// its declarations; dist/cjs gets a package.json saying it is CommonJS.
import { execFileSync } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);
const findTsc = () => {
  try {
    return require.resolve('typescript/bin/tsc');
  } catch {
    return undefined;
  }
};
let tsc = findTsc();
if (!tsc) {
  // `npm install ./clients/node` from a user's project runs this `prepare`
  // in a fresh clone, where the package's own dependencies (typescript, and
  // cluster-key-slot, which npm does not install for a linked folder) are
  // missing: install them here, from package-lock.json, as `npm ci` would.
  // The outer npm's settings (--global, --prefix, ...) must not reach it.
  const env = Object.fromEntries(
    Object.entries(process.env).filter(([k]) => !/^npm_config_/i.test(k) || /^npm_config_(registry|cache|userconfig)$/i.test(k)),
  );
  console.error('redis-idem: installing its build dependencies (npm ci in clients/node)');
  execFileSync('npm', ['ci', '--ignore-scripts', '--no-audit', '--no-fund', '--loglevel=error'], { stdio: 'inherit', cwd: root, env });
  tsc = findTsc();
  if (!tsc) {
    console.error('redis-idem: typescript is still missing after npm ci in clients/node');
    process.exit(1);
  }
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
