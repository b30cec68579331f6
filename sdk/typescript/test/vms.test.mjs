// VMs and their lifecycle: create (labels, env, idempotency), get, list,
// pause/resume, suspend/wake, resize, policy, logs, stop/start, delete, and
// the typed errors of each failure.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import {
  AgentVM,
  AgentVMError,
  ConflictError,
  ConnectionError,
  InvalidArgumentError,
  NotFoundError,
  UnauthorizedError,
  isNotFound,
} from '../dist/index.js'
import { av, cleanup, createVM, needsDaemon, uniq, until } from './helpers.mjs'

const name = uniq('tsvm')
let vm
before(async () => {
  if (needsDaemon) return
  vm = await createVM({ name, labels: { suite: 'ts-sdk', run: name }, env: { GREETING: 'hello-from-env' }, idempotency_key: 'key-' + name })
})
after(() => cleanup(vm))

test('create returns a running VM with its labels and env', { skip: needsDaemon }, async () => {
  assert.match(vm.id, /^vm-[0-9a-f]{12}$/)
  assert.equal(vm.name, name)
  assert.equal(vm.state, 'running')
  assert.equal(vm.info.memory_mib, 512)
  assert.deepEqual(vm.info.labels, { suite: 'ts-sdk', run: name })
  assert.ok(vm.info.ip)
  const r = await vm.exec('echo $GREETING; hostname')
  assert.equal(r.stdout, `hello-from-env\n${name}\n`)
  // The same idempotency key returns the same VM instead of a second one.
  const again = await av.vms.create({ name: name + '-x', memory: 512, idempotency_key: 'key-' + name })
  assert.equal(again.id, vm.id)
})

test('get, open by name, list with label filters', { skip: needsDaemon }, async () => {
  const got = await av.vms.get(name)
  assert.equal(got.id, vm.id)
  const byName = av.vm(name)
  assert.equal((await byName.refresh()).id, vm.id)
  const listed = await av.vms.list({ labels: { run: name } })
  assert.deepEqual(listed.map((v) => v.id), [vm.id])
  assert.deepEqual((await av.vms.list({ labels: ['suite=ts-sdk', 'run'] })).filter((v) => v.id === vm.id).length, 1)
  assert.equal((await av.vms.list({ labels: { run: 'no-such-run' } })).length, 0)
})

test('pause and resume', { skip: needsDaemon }, async () => {
  const p = await vm.pause()
  assert.equal(p.state, 'paused')
  assert.equal(p.op.name, 'pause')
  assert.equal(vm.state, 'paused')
  const r = await vm.resume()
  assert.equal(r.state, 'running')
  assert.equal((await vm.exec(['true'])).exit_code, 0)
  // exec resumes a paused VM on its own
  await vm.pause()
  assert.equal((await vm.exec('echo resumed')).stdout, 'resumed\n')
  assert.equal((await vm.refresh()).state, 'running')
})

test('suspend, then exec and wake bring it back where it was', { skip: needsDaemon }, async () => {
  await vm.exec('echo kept-in-memory > /dev/shm/marker')
  const s = await vm.suspend()
  assert.equal(s.state, 'suspended')
  assert.equal(s.op.name, 'suspend')
  assert.equal((await vm.exec('cat /dev/shm/marker')).stdout, 'kept-in-memory\n')
  await vm.suspend()
  const w = await vm.wake()
  assert.equal(w.state, 'running')
})

test('resize grows the disk online; policy and logs', { skip: needsDaemon }, async () => {
  const before = vm.info.disk_bytes
  const fsSize = async () => Number((await vm.exec('df -B1 --output=size / | tail -1')).stdout.trim())
  const fsBefore = await fsSize()
  const v = await vm.resize({ disk: before / 2 ** 20 + 1024 })
  assert.ok(v.disk_bytes >= before + 2 ** 30, `disk_bytes ${v.disk_bytes}`)
  await until('the guest to see the bigger disk', async () => (await fsSize()) > fsBefore + 2 ** 29)
  const p = await vm.setPolicy({ idle_timeout: '2h', restart: 'on-failure' })
  assert.equal(p.idle_timeout_s, 7200)
  assert.equal(p.restart, 'on-failure')
  await vm.setPolicy({ idle_timeout: '0' })
  const logs = await vm.logs()
  assert.equal(typeof logs, 'string')
})

test('stop, conflict while stopped, start boots it again', { skip: needsDaemon, timeout: 300_000 }, async () => {
  await vm.exec('echo on-disk > /root/kept && sync')
  const s = await vm.stop()
  assert.equal(s.state, 'stopped')
  await assert.rejects(vm.exec(['true']), (err) => {
    assert.ok(err instanceof ConflictError, String(err))
    assert.equal(err.status, 409)
    assert.equal(err.code, 'conflict')
    return true
  })
  const st = await vm.start()
  assert.equal(st.state, 'running')
  assert.equal((await vm.exec('cat /root/kept')).stdout, 'on-disk\n')
})

test('typed errors', { skip: needsDaemon }, async () => {
  await assert.rejects(av.vms.get('no-such-vm-' + name), (err) => {
    assert.ok(err instanceof NotFoundError)
    assert.ok(err instanceof AgentVMError)
    assert.equal(err.status, 404)
    assert.equal(err.code, 'not_found')
    assert.match(err.message, /no-such-vm/)
    assert.ok(isNotFound(err))
    return true
  })
  await assert.rejects(av.vms.create({ name: 'Not_A_DNS_Label' }), (err) => err instanceof InvalidArgumentError && err.code === 'invalid_argument' && err.status === 400)
  await assert.rejects(av.vms.create({ name, memory: 512 }), (err) => err instanceof ConflictError && err.code === 'conflict')
  await assert.rejects(av.vms.create({ bogus: 1 }), (err) => err.status === 400 && /unknown field/.test(err.message))
  const bad = new AgentVM({ url: av.url, token: 'avm_wrong' })
  await assert.rejects(bad.vms.list(), (err) => err instanceof UnauthorizedError && err.code === 'unauthorized' && err.status === 401)
  assert.equal((await bad.health()).status, 'ok') // health needs no token
  const nowhere = new AgentVM({ url: 'http://127.0.0.1:9', token: 'x' })
  await assert.rejects(nowhere.health(), (err) => err instanceof ConnectionError && err.status === 0 && err.code === 'connection_failed')
})

test('delete', { skip: needsDaemon }, async () => {
  const extra = await createVM()
  await extra.delete()
  await assert.rejects(extra.refresh(), NotFoundError)
  await assert.rejects(av.vms.delete(extra.id), NotFoundError)
})
