// Generates src/generated/openapi.ts from the REST API contract
// (api/openapi.yaml) with openapi-typescript, or with --check regenerates it
// into a temp dir and fails when the committed file differs (the CI drift
// check: run `npm run gen` and commit the result).
import { spawnSync } from 'node:child_process'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, relative, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const spec = resolve(root, process.env.AGENTVM_OPENAPI || '../../api/openapi.yaml')
const committed = join(root, 'src', 'generated', 'openapi.ts')
const check = process.argv.includes('--check')

const tmp = check ? mkdtempSync(join(tmpdir(), 'agentvm-gen-')) : ''
const out = check ? join(tmp, 'openapi.ts') : committed
const bin = join(root, 'node_modules', 'openapi-typescript', 'bin', 'cli.js')
// Paths relative to the package, so the generated header is the same wherever it runs.
const r = spawnSync(process.execPath, [bin, relative(root, spec), '--output', relative(root, out)], { cwd: root, encoding: 'utf8' })
if (r.status !== 0) {
  process.stderr.write(r.stdout + r.stderr)
  process.stderr.write(`openapi-typescript failed on ${spec}\n`)
  process.exit(1)
}
if (!check) {
  process.stdout.write(`generated ${relative(root, committed)} from ${spec}\n`)
  process.exit(0)
}
const want = readFileSync(out, 'utf8')
rmSync(tmp, { recursive: true, force: true })
let have = ''
try {
  have = readFileSync(committed, 'utf8')
} catch {}
if (have === want) {
  process.stdout.write(`${relative(root, committed)} matches ${spec}\n`)
  process.exit(0)
}
const a = have.split('\n'), b = want.split('\n')
let i = 0
while (i < a.length && i < b.length && a[i] === b[i]) i++
process.stderr.write(`${relative(root, committed)} is out of date with ${spec}: first difference at line ${i + 1}\n`)
for (let j = Math.max(0, i - 2); j < Math.min(i + 6, Math.max(a.length, b.length)); j++) {
  if (j < a.length && a[j] !== b[j]) process.stderr.write(`- ${a[j]}\n`)
  if (j < b.length && a[j] !== b[j]) process.stderr.write(`+ ${b[j]}\n`)
  if (a[j] === b[j]) process.stderr.write(`  ${a[j]}\n`)
}
process.stderr.write('run `npm run gen` in sdk/typescript and commit src/generated/openapi.ts\n')
process.exit(1)
