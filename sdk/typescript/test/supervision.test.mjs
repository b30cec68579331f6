// Supervision and evidence: services (create, state, logs followed,
// restart, stop, start, delete), processes, detached jobs, the event log
// followed as it happens, and the server-wide calls.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { InvalidArgumentError, NotFoundError } from '../dist/index.js'
import { av, cleanup, createVM, needsDaemon, readAll, uniq, until } from './helpers.mjs'

let vm
before(async () => {
  if (!needsDaemon) vm = await createVM({ name: uniq('tssvc') })
})
after(() => cleanup(vm))

const state = (s) => `${s.active_state}/${s.sub_state}`

test('services: create, logs, follow, restart, stop, start, delete', { skip: needsDaemon, timeout: 300_000 }, async () => {
  const created = await vm.services.create({ name: 'ticker', shell: 'while true; do echo tick-$(date +%s%N); sleep 0.5; done', restart: 'always' })
  assert.equal(created.name, 'ticker')
  const running = await until('the service to run', async () => {
    const s = await vm.services.get('ticker')
    return state(s) === 'active/running' && s.main_pid > 0 && s
  })
  assert.ok((await vm.services.list()).some((s) => s.name === 'ticker'))
  await until('journal lines', async () => (await vm.services.logs('ticker', { lines: 20 })).includes('tick-'))

  // follow: new lines arrive on the open stream
  const ac = new AbortController()
  const seen = []
  const deadline = setTimeout(() => ac.abort(), 120_000)
  for await (const line of vm.services.follow('ticker', { lines: 1, signal: ac.signal })) {
    if (line.includes('tick-')) seen.push(line)
    if (seen.length >= 3) break
  }
  clearTimeout(deadline)
  assert.equal(seen.length, 3, 'three lines followed')

  const restarted = await vm.services.restart('ticker')
  assert.equal(restarted.name, 'ticker')
  await until('a new main process', async () => {
    const s = await vm.services.get('ticker')
    return state(s) === 'active/running' && s.main_pid !== running.main_pid
  })
  const stopped = await vm.services.stop('ticker')
  assert.notEqual(stopped.active_state, 'active')
  const started = await vm.services.start('ticker')
  assert.equal(started.active_state, 'active')
  await vm.services.delete('ticker')
  await assert.rejects(vm.services.get('ticker'), NotFoundError)
})

test('processes: list and signal', { skip: needsDaemon }, async () => {
  await vm.exec("nohup sleep 777 >/dev/null 2>&1 &")
  const ps = await until('the sleep process', async () => {
    const l = await vm.processes.list()
    return l.some((p) => p.command?.includes('sleep 777')) && l
  })
  assert.ok(ps.some((p) => p.pid === 1))
  const sleeper = ps.find((p) => p.command.includes('sleep 777'))
  await vm.processes.signal(sleeper.pid, 'KILL')
  await until('the process to be gone', async () => !(await vm.processes.list()).some((p) => p.pid === sleeper.pid))
  await assert.rejects(vm.processes.signal(1, 'KILL'), InvalidArgumentError)
})

test('jobs: output followed to the end, exit code, stderr, signal, delete', { skip: needsDaemon }, async () => {
  const job = await vm.jobs.start('for i in 1 2 3; do echo line-$i; sleep 0.4; done; echo err-out >&2; exit 7')
  assert.ok(job.id)
  assert.equal(await vm.jobs.logs(job.id, { follow: true }), 'line-1\nline-2\nline-3\n')
  const done = await vm.jobs.wait(job.id, { timeoutMs: 60_000 })
  assert.equal(done.exited, true)
  assert.equal(done.exit_code, 7)
  assert.equal(await vm.jobs.logs(job.id, { stream: 'stderr' }), 'err-out\n')
  assert.equal((await readAll(await vm.jobs.stream(job.id, { offset: 7 }))).toString(), 'line-2\nline-3\n')
  assert.ok((await vm.jobs.list()).some((j) => j.id === job.id))
  assert.equal((await vm.jobs.get(job.id)).exit_code, 7)

  const long = await vm.jobs.start(['sleep', '600'], { user: 'agent' })
  assert.equal(long.user, 'agent')
  const still = await vm.jobs.wait(long.id, { timeoutMs: 200 })
  assert.equal(still.exited, false)
  await vm.jobs.signal(long.id, 'KILL')
  const killed = await vm.jobs.wait(long.id, { timeoutMs: 60_000 })
  assert.equal(killed.exited, true)
  assert.ok(killed.signal, JSON.stringify(killed))
  await vm.jobs.delete(job.id)
  await assert.rejects(vm.jobs.get(job.id), NotFoundError)
})

test('events: listed and followed as they happen', { skip: needsDaemon }, async () => {
  const all = await vm.events.list()
  assert.ok(all.length > 0)
  assert.ok(all.some((e) => e.type === 'exec'), JSON.stringify(all.map((e) => e.type)))
  const last = all[all.length - 1].seq
  assert.deepEqual((await vm.events.list({ after: last })).length, 0)
  assert.equal((await vm.events.list({ limit: 1 })).length, 1)

  const ac = new AbortController()
  const timer = setTimeout(() => ac.abort(), 120_000)
  const got = []
  const follow = (async () => {
    for await (const e of vm.events.follow({ after: last, signal: ac.signal })) {
      got.push(e)
      if (e.type === 'exec' && e.data?.cmd?.includes('event-marker')) return e
    }
  })()
  await vm.exec('echo event-marker')
  const e = await follow
  clearTimeout(timer)
  assert.ok(e, 'the exec event arrived on the followed stream')
  assert.equal(e.actor, 'admin')
  assert.equal(e.data.exit_code, '0')
  assert.ok(e.seq > last)
  assert.equal(e.vm, vm.id)

  // an abort ends a follow that sees nothing
  const quiet = new AbortController()
  setTimeout(() => quiet.abort(), 500)
  for await (const ev of vm.events.follow({ after: e.seq + 1000, signal: quiet.signal })) assert.fail(`unexpected event ${JSON.stringify(ev)}`)
})

test('server: health, metrics, CA', { skip: needsDaemon }, async () => {
  const h = await av.health()
  assert.equal(h.status, 'ok')
  assert.ok(['kvm', 'tcg'].includes(h.accel))
  assert.match(await av.metrics(), /agentvm_/)
  await assert.rejects(av.ca(), NotFoundError) // not running with --tls auto
})
