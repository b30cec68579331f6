// Builds the console into internal/console/dist, which the agentvm binary
// embeds (go:embed): dist/index.html and dist/ui/{app.js,app.css}.
import * as esbuild from 'esbuild';
import { copyFileSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, '..', 'internal', 'console', 'dist');

// Keep the committed placeholder files (.keep, .gitignore); replace the rest.
mkdirSync(out, { recursive: true });
for (const f of readdirSync(out)) {
  if (!f.startsWith('.')) rmSync(join(out, f), { recursive: true, force: true });
}

await esbuild.build({
  entryPoints: { app: join(here, 'src', 'main.ts') },
  bundle: true,
  minify: true,
  sourcemap: false,
  target: ['es2022'],
  format: 'iife',
  outdir: join(out, 'ui'),
  legalComments: 'linked',
  logLevel: 'warning',
});
copyFileSync(join(here, 'index.html'), join(out, 'index.html'));
console.log('console built into ' + out);
