// The code interpreter: a code-interpreter VM's live kernels through
// vm.code (run, stream, contexts) and its typed errors.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { ConflictError, NotFoundError } from '../dist/index.js'
import { av, cleanup, needsDaemon, uniq } from './helpers.mjs'

let vm
before(async () => {
  if (needsDaemon) return
  vm = await av.vms.create({ name: uniq('tscode'), image: 'code-interpreter', memory: 1024 })
})
after(() => cleanup(vm))

test('run keeps state; results, streams and errors', { skip: needsDaemon }, async () => {
  assert.equal(vm.info.image, 'code-interpreter')
  await vm.code.run('n = 20')
  const ex = await vm.code.run('print("half"); n * 2 + 2')
  assert.equal(ex.text, '42')
  assert.equal(ex.stdout, 'half\n')
  const types = []
  for await (const e of vm.code.stream('import sys; print("e", file=sys.stderr)')) types.push(e.type)
  assert.deepEqual(types.filter((t) => t !== 'count'), ['stderr', 'end'])
  const bad = await vm.code.run('1 / 0')
  assert.equal(bad.error.name, 'ZeroDivisionError')
  const js = await vm.code.run('[1, 2, 3].length', { language: 'javascript' })
  assert.equal(js.text, '3')
})

test('contexts', { skip: needsDaemon }, async () => {
  const ctx = await vm.code.createContext({ language: 'bash', cwd: '/tmp' })
  const r = await vm.code.run('pwd', { context: ctx.id })
  assert.equal(r.stdout, '/tmp\n')
  assert.ok((await vm.code.contexts()).some((c) => c.id === ctx.id))
  await vm.code.deleteContext(ctx.id)
  await assert.rejects(vm.code.run('pwd', { context: ctx.id }), NotFoundError)
})

test('a default-image VM has no kernels', { skip: needsDaemon }, async () => {
  const plain = await av.vms.create({ name: uniq('tsnocode'), memory: 512 })
  try {
    await assert.rejects(plain.code.run('1'), ConflictError)
  } finally {
    await cleanup(plain)
  }
})
