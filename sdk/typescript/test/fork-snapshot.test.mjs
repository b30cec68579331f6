// Snapshots (take, list, get, create from, delete) and live fork: the
// copies keep the running processes and memory, and diverge afterwards.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { NotFoundError } from '../dist/index.js'
import { av, cleanup, createVM, needsDaemon, uniq, until } from './helpers.mjs'

const snapName = uniq('tssnap')
let vm
const extra = []
before(async () => {
  if (needsDaemon) return
  vm = await createVM({ name: uniq('tsfork') })
  // State on disk, in memory (tmpfs) and a running process.
  await vm.exec('echo on-disk > /root/marker; echo in-memory > /dev/shm/marker')
  await vm.exec("nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /dev/shm/count.new; mv /dev/shm/count.new /dev/shm/count; sleep 0.2; done' >/dev/null 2>&1 &")
  await until('the counter to run', async () => Number((await vm.exec('cat /dev/shm/count 2>/dev/null || echo 0')).stdout) > 0)
})
after(async () => {
  await cleanup(vm, ...extra)
  if (!needsDaemon) await av.snapshots.delete(snapName).catch(() => {})
})

const counter = async (v) => Number((await v.exec('cat /dev/shm/count')).stdout)

test('snapshot, list, get, create from it', { skip: needsDaemon, timeout: 300_000 }, async () => {
  const s = await vm.snapshot(snapName)
  assert.equal(s.name, snapName)
  assert.match(s.id, /^snap-[0-9a-f]{12}$/)
  assert.equal(s.vm_id, vm.id)
  assert.equal(s.memory_mib, 512)
  assert.ok(s.state_bytes > 0)
  assert.ok((await av.snapshots.list()).some((x) => x.id === s.id))
  assert.equal((await av.snapshots.get(snapName)).id, s.id)
  assert.equal((await av.snapshots.get(s.id)).name, snapName)

  const copy = await av.vms.create({ from: snapName, name: uniq('tsfromsnap') })
  extra.push(copy)
  assert.equal(copy.state, 'running')
  assert.equal(copy.info.source, `snapshot ${snapName}`)
  assert.equal((await copy.exec('cat /root/marker /dev/shm/marker; hostname')).stdout, `on-disk\nin-memory\n${copy.name}\n`)
  // the counter process came along and keeps counting
  const c0 = await counter(copy)
  await until('the restored counter to move on', async () => (await counter(copy)) > c0)
})

test('fork: two live copies that diverge; the parent keeps running', { skip: needsDaemon, timeout: 300_000 }, async () => {
  const before = await counter(vm)
  const f = await vm.fork(2)
  assert.equal(f.parent, vm)
  assert.equal(f.children.length, 2)
  extra.push(...f.children)
  assert.equal(typeof f.parent_pause_ms, 'number')
  assert.ok(f.state_bytes > 0)
  for (const c of f.children) {
    assert.equal(c.state, 'running')
    assert.notEqual(c.id, vm.id)
    assert.equal(c.info.source, `fork of ${vm.name}`)
    assert.equal((await c.exec('cat /dev/shm/marker')).stdout, 'in-memory\n')
    assert.ok((await counter(c)) >= before)
  }
  const [a, b] = f.children
  await a.exec('echo only-in-a > /root/marker')
  assert.equal((await b.exec('cat /root/marker')).stdout, 'on-disk\n')
  assert.equal((await vm.exec('cat /root/marker')).stdout, 'on-disk\n')
  const p0 = await counter(vm)
  await until('the parent counter to move on', async () => (await counter(vm)) > p0)
})

test('delete a snapshot', { skip: needsDaemon }, async () => {
  await av.snapshots.delete(snapName)
  await assert.rejects(av.snapshots.get(snapName), NotFoundError)
  await assert.rejects(av.vms.create({ from: snapName }), NotFoundError)
})
