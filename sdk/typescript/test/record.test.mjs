// The durable record: a hosted repository the VM clones at create and
// pushes to with no credential, what changed on its disk, and its exec
// recordings.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { av, cleanup, createVM, needsDaemon, uniq } from './helpers.mjs'

const repo = uniq('tsrepo')
let vm
before(async () => {
  if (needsDaemon) return
  await av.repos.create(repo)
})
after(async () => {
  await cleanup(vm)
  if (!needsDaemon) await av.repos.delete(repo).catch(() => {})
})

test('repos: create, push from the VM, events, tokens, hooks', { skip: needsDaemon, timeout: 300_000 }, async () => {
  const r = await av.repos.get(repo)
  assert.equal(r.url, `/git/${repo}.git`)
  assert.equal(r.head, 'main')
  assert.ok((await av.repos.list()).some((x) => x.name === repo))
  // An empty repository clones; the VM commits and pushes main back.
  vm = await createVM({ name: uniq('tsrec'), repo })
  const res = await vm.exec(`cd /home/agent/${repo} && echo hi > a.txt && git add a.txt && git commit -qm one && git push -q origin HEAD:main && git rev-parse HEAD`, { user: 'agent' })
  assert.equal(res.exit_code, 0, res.stderr)
  assert.equal((await av.repos.get(repo)).branches.main, res.stdout.trim())
  const evs = await av.repos.events(repo)
  assert.ok(evs.some((e) => e.type === 'push' && e.actor === `vm:${vm.id}` && e.data.ref === 'refs/heads/main'))
  const tok = await av.repos.token(repo, { access: 'write', branches: 'agent/*', ttl: '10m' })
  assert.equal(tok.repo, repo)
  assert.deepEqual(tok.allow, ['read', 'write'])
  assert.equal(tok.branches, 'agent/*')
  assert.match(tok.token, /^avt_/)
  const hook = await av.repos.addHook(repo, 'http://127.0.0.1:9/hook', { allowPrivate: true })
  assert.match(hook.secret, /^[0-9a-f]{48}$/)
  await av.repos.removeHook(repo, hook.id)
  await av.tokens.revoke(tok.id)
})

test('diff and recordings of the VM', { skip: needsDaemon, timeout: 300_000 }, async () => {
  await vm.exec('printf "x\\n" > /root/ts-diff.txt && sync')
  const d = await vm.diff({ diffs: true })
  const added = d.added.find((e) => e.path === '/root/ts-diff.txt')
  assert.ok(added, JSON.stringify(d.added.map((e) => e.path)))
  assert.match(added.diff, /\+x\n/)
  assert.equal(d.since, 'create')
  const recs = await vm.recordings.list()
  assert.equal(recs.enabled, true)
  const ex = recs.recordings.find((r) => r.kind === 'exec' && r.title.includes('ts-diff.txt'))
  assert.ok(ex, JSON.stringify(recs.recordings))
  const line = JSON.parse(await vm.recordings.get(ex.id))
  assert.equal(line.exit_code, 0)
  assert.equal(line.via, 'api')
  const tgz = await vm.recordings.export()
  assert.equal(tgz[0], 0x1f)
  assert.equal(tgz[1], 0x8b)
  await vm.recordings.setEnabled(false)
  assert.equal((await vm.recordings.list()).enabled, false)
})
