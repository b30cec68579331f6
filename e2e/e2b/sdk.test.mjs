// Drives agentvm through the unmodified `e2b` npm package (installed by
// e2e/e2b_test.go into a temp dir next to a copy of this file). Environment:
// E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL, E2B_DOMAIN as in docs/e2b.md,
// plus AGENTVM_PROXY (host:port of the preview proxy), AGENTVM_SCOPED_KEY (a
// key scoped to another VM) and RUN (a per-run id).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import http from 'node:http'
import {
  Sandbox, CommandExitError, TimeoutError, AuthenticationError, NotFoundError,
  SandboxNotFoundError, FileNotFoundError, FilesystemEventType,
} from 'e2b'

const RUN = process.env.RUN
const PROXY = process.env.AGENTVM_PROXY
const made = []
let sbx

const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

// waitFor polls cond until it holds (generous deadline: TCG is slow).
async function waitFor(what, cond, ms = 180_000) {
  const end = Date.now() + ms
  for (;;) {
    try {
      if (await cond()) return
    } catch (e) {
      if (Date.now() > end) throw e
    }
    if (Date.now() > end) throw new Error('timed out waiting for ' + what)
    await sleep(250)
  }
}

// get sends a GET through the preview proxy with the given Host.
function get(host, path, headers = {}) {
  return new Promise((resolve, reject) => {
    const [h, p] = PROXY.split(':')
    const req = http.request({ host: h, port: Number(p), path, headers: { Host: host, ...headers } }, (res) => {
      const chunks = []
      res.on('data', (c) => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString() }))
    })
    req.on('error', reject)
    req.end()
  })
}

after(async () => {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
})

test('create', async () => {
  sbx = await Sandbox.create({ timeoutMs: 900_000, metadata: { suite: 'js', run: RUN } })
  made.push(sbx.sandboxId)
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
  assert.equal(await sbx.isRunning(), true)
})

test('commands: foreground, env, cwd, user, exit codes', async () => {
  const r = await sbx.commands.run('echo hello; echo oops >&2')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hello\n')
  assert.equal(r.stderr, 'oops\n')
  assert.equal((await sbx.commands.run('whoami')).stdout.trim(), 'user')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout.trim(), 'root')
  assert.equal((await sbx.commands.run('echo $FOO', { envs: { FOO: 'bar' } })).stdout, 'bar\n')
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  const chunks = []
  await sbx.commands.run('for i in 1 2 3; do echo $i; done', { onStdout: (d) => chunks.push(d) })
  assert.equal(chunks.join(''), '1\n2\n3\n')
  await assert.rejects(sbx.commands.run('exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)
})

test('commands are recorded by agentvm (GET /v1/vms/{id}/recordings)', async () => {
  const h = { Authorization: `Bearer ${process.env.AGENTVM_TOKEN}` }
  const base = `${process.env.AGENTVM_URL}/v1/vms/${sbx.sandboxId}/recordings`
  const list = await (await fetch(base, { headers: h })).json()
  const rec = list.recordings.find((r) => r.kind === 'exec' && r.title.includes('echo hello; echo oops'))
  assert.ok(rec, JSON.stringify(list))
  const line = await (await fetch(`${base}/${rec.id}`, { headers: h })).json()
  assert.equal(line.via, 'e2b')
  assert.equal(line.stdout, 'hello\n')
  assert.equal(line.stderr, 'oops\n')
  assert.equal(line.exit_code, 0)
  assert.equal(line.user, 'user')
})

test('commands: background, list, reattach, stdin, kill, timeout', async () => {
  // runs until the test says so (a file), however slow the steps between
  const h = await sbx.commands.run('until [ -e /tmp/go-bg ]; do sleep 0.1; done; echo bg', { background: true })
  assert.ok(h.pid > 0)
  const listed = await sbx.commands.list()
  assert.ok(listed.some((p) => p.pid === h.pid), 'the background command is listed')
  await h.disconnect()
  const again = await sbx.commands.connect(h.pid)
  await sbx.files.write('/tmp/go-bg', '')
  const r = await again.wait()
  assert.equal(r.stdout, 'bg\n')

  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  await sbx.commands.sendStdin(cat.pid, 'abc\n')
  await sbx.commands.closeStdin(cat.pid)
  assert.equal((await cat.wait()).stdout, 'abc\n')

  const sleeper = await sbx.commands.run('sleep 300', { background: true })
  assert.equal(await sbx.commands.kill(sleeper.pid), true)
  await assert.rejects(sleeper.wait(), CommandExitError)
  assert.equal(await sbx.commands.kill(sleeper.pid), false)

  await assert.rejects(sbx.commands.run('sleep 60', { timeoutMs: 1500 }), TimeoutError)
})

test('files: text, bytes, list, info, dirs, rename, remove', async () => {
  await sbx.files.write('/home/user/hello.txt', 'hi there')
  assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hi there')
  const bytes = new Uint8Array([0, 1, 2, 250, 255])
  await sbx.files.write('/home/user/sub/dir/b.bin', bytes.buffer)
  assert.deepEqual(new Uint8Array(await sbx.files.read('/home/user/sub/dir/b.bin', { format: 'bytes' })), bytes)
  const info = await sbx.files.getInfo('/home/user/hello.txt')
  assert.equal(info.name, 'hello.txt')
  assert.equal(info.type, 'file')
  assert.equal(info.size, 8)
  assert.equal(info.owner, 'user')
  const names = (await sbx.files.list('/home/user')).map((e) => e.name)
  assert.ok(names.includes('hello.txt') && names.includes('sub'), names.join(','))
  const deep = (await sbx.files.list('/home/user', { depth: 3 })).map((e) => e.path)
  assert.ok(deep.includes('/home/user/sub/dir/b.bin'), deep.join(','))
  assert.equal(await sbx.files.makeDir('/home/user/newdir'), true)
  assert.equal(await sbx.files.makeDir('/home/user/newdir'), false)
  await sbx.files.rename('/home/user/hello.txt', '/home/user/renamed.txt')
  assert.equal(await sbx.files.exists('/home/user/hello.txt'), false)
  assert.equal(await sbx.files.exists('/home/user/renamed.txt'), true)
  await sbx.files.remove('/home/user/renamed.txt')
  assert.equal(await sbx.files.exists('/home/user/renamed.txt'), false)
  await assert.rejects(sbx.files.read('/home/user/missing'), FileNotFoundError)
  const big = 'x'.repeat(300_000) + 'end'
  await sbx.files.write('/home/user/big.txt', big)
  assert.equal(await sbx.files.read('/home/user/big.txt'), big)
  assert.equal(await sbx.files.read('/home/user/big.txt', { gzip: true }), big)
  await sbx.files.write('/home/user/empty.txt', '')
  assert.equal(await sbx.files.read('/home/user/empty.txt'), '')
  const withMeta = await sbx.files.write('/home/user/meta.txt', 'm', { metadata: { owner: 'team-a', Purpose: 'test' } })
  assert.deepEqual(withMeta.metadata, { owner: 'team-a', purpose: 'test' })
  assert.deepEqual((await sbx.files.getInfo('/home/user/meta.txt')).metadata, { owner: 'team-a', purpose: 'test' })
  const multi = await sbx.files.write([{ path: '/home/user/m1.txt', data: 'one' }, { path: '/home/user/m2.txt', data: 'two' }])
  assert.equal(multi.length, 2)
  assert.equal(await sbx.files.read('/home/user/m2.txt'), 'two')
})

test('files: watch', async () => {
  await sbx.files.makeDir('/home/user/w')
  const events = []
  const handle = await sbx.files.watchDir('/home/user/w', (e) => events.push(e), { recursive: true })
  await sbx.files.write('/home/user/w/a.txt', 'x')
  // d/b.txt once the new directory is watched (its CREATE seen): a file
  // made before the watch is added is not reported
  await sbx.commands.run('mkdir -p /home/user/w/d')
  await waitFor('the new directory', () => events.some((e) => e.name === 'd' && e.type === FilesystemEventType.CREATE), 60_000)
  await sbx.commands.run('echo y > /home/user/w/d/b.txt && rm /home/user/w/a.txt')
  await waitFor('watch events', () =>
    events.some((e) => e.name === 'a.txt' && e.type === FilesystemEventType.WRITE) &&
    events.some((e) => e.name === 'd/b.txt' && e.type === FilesystemEventType.CREATE) &&
    events.some((e) => e.name === 'a.txt' && e.type === FilesystemEventType.REMOVE), 60_000)
  await handle.stop()
})

test('files: signed upload and download URLs', async () => {
  const up = new URL(await sbx.uploadUrl('/home/user/signed.txt'))
  const host = `49983-${sbx.sandboxId}.${process.env.E2B_DOMAIN}`
  const boundary = 'xyzBOUNDARY'
  const body = `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="signed.txt"\r\nContent-Type: text/plain\r\n\r\nsigned body\r\n--${boundary}--\r\n`
  const res = await new Promise((resolve, reject) => {
    const [h, p] = PROXY.split(':')
    const req = http.request({ host: h, port: Number(p), method: 'POST', path: up.pathname + up.search,
      headers: { Host: host, 'Content-Type': `multipart/form-data; boundary=${boundary}`, 'Content-Length': Buffer.byteLength(body) } },
    (r) => { r.resume(); r.on('end', () => resolve(r.statusCode)) })
    req.on('error', reject)
    req.end(body)
  })
  assert.equal(res, 200)
  const down = new URL(await sbx.downloadUrl('/home/user/signed.txt'))
  const got = await get(host, down.pathname + down.search)
  assert.equal(got.status, 200)
  assert.equal(got.body, 'signed body')
  const forged = await get(host, down.pathname + down.search.replace(/signature=[^&]+/, 'signature=v1_forged'))
  assert.equal(forged.status, 401)
})

test('pty', async () => {
  let out = ''
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += new TextDecoder().decode(d) } })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('tput cols\n'))
  await waitFor('80 columns', () => /\b80\b/.test(out), 60_000)
  await sbx.pty.resize(term.pid, { cols: 123, rows: 30 })
  await sbx.pty.sendInput(term.pid, new TextEncoder().encode('tput cols\n'))
  await waitFor('123 columns', () => /\b123\b/.test(out), 60_000)
  assert.equal(await sbx.pty.kill(term.pid), true)
})

test('getHost reaches a server in the sandbox', async () => {
  await sbx.commands.run('cd /tmp && echo served > index.html && python3 -m http.server 8000', { background: true, timeoutMs: 0 })
  const host = sbx.getHost(8000)
  assert.equal(host, `8000-${sbx.sandboxId}.${process.env.E2B_DOMAIN}`)
  await waitFor('the server', async () => (await get(host, '/index.html')).body === 'served\n', 60_000)
  const closed = await get(sbx.getHost(8001), '/')
  assert.equal(closed.status, 502)
  assert.match(closed.body, /port is not open/)
  // A server on the sandbox's loopback only (as DevTools and the code
  // interpreter are) is not public: it needs the sandbox's traffic (or
  // envd) access token, which a shared preview URL does not carry.
  await sbx.commands.run('cd /tmp && python3 -m http.server 8002 --bind 127.0.0.1', { background: true, timeoutMs: 0 })
  await waitFor('the loopback server', async () => (await sbx.commands.run('curl -sf http://127.0.0.1:8002/index.html')).stdout === 'served\n', 60_000)
  const anon = await get(sbx.getHost(8002), '/index.html')
  assert.equal(anon.status, 502)
  assert.match(anon.body, /port is not open/)
  assert.ok(sbx.trafficAccessToken, 'create answers a trafficAccessToken')
  const withToken = await get(sbx.getHost(8002), '/index.html', { 'E2B-Traffic-Access-Token': sbx.trafficAccessToken })
  assert.equal(withToken.body, 'served\n')
  const forgedTraffic = await get(sbx.getHost(8002), '/index.html', { 'E2B-Traffic-Access-Token': 'admin.' + '0'.repeat(40) })
  assert.equal(forgedTraffic.status, 401)
})

test('info, list, timeout, metrics', async () => {
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.state, 'running')
  assert.equal(info.metadata.run, RUN)
  const other = await Sandbox.create({ timeoutMs: 900_000, metadata: { suite: 'js', run: RUN } })
  made.push(other.sandboxId)
  const paginator = Sandbox.list({ query: { metadata: { run: RUN } }, limit: 1 })
  const seen = []
  while (paginator.hasNext) {
    const items = await paginator.nextItems()
    assert.ok(items.length <= 1)
    seen.push(...items.map((s) => s.sandboxId))
  }
  assert.deepEqual(seen.sort(), [sbx.sandboxId, other.sandboxId].sort())
  await sbx.setTimeout(600_000)
  const end = (await sbx.getInfo()).endAt.getTime()
  assert.ok(end > Date.now() + 500_000 && end < Date.now() + 700_000)
  const m = await sbx.getMetrics()
  assert.ok(m.length >= 1 && m[0].memTotal > 0 && m[0].cpuCount >= 1, JSON.stringify(m))
  await other.kill()
  made.splice(made.indexOf(other.sandboxId), 1)
})

test('pause, then connect: processes and files intact', async () => {
  await sbx.files.write('/home/user/keep.txt', 'kept')
  const sleeper = await sbx.commands.run('sleep 3000', { background: true, timeoutMs: 0 })
  assert.equal(await sbx.pause(), true)
  assert.equal((await sbx.getInfo()).state, 'paused')
  assert.equal(await Sandbox.pause(sbx.sandboxId), false)
  const paused = await Sandbox.list({ query: { state: ['paused'], metadata: { run: RUN } } }).nextItems()
  assert.deepEqual(paused.map((s) => s.sandboxId), [sbx.sandboxId])
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.getInfo()).state, 'running')
  assert.equal(await again.files.read('/home/user/keep.txt'), 'kept')
  assert.ok((await again.commands.list()).some((p) => p.pid === sleeper.pid), 'the process survived the pause')
  sbx = again
})

test('snapshot, then create from it', async () => {
  await sbx.files.write('/home/user/snap.txt', 'in the snapshot')
  const snap = await sbx.createSnapshot()
  assert.ok(snap.snapshotId)
  const fromSnap = await Sandbox.create(snap.snapshotId, { timeoutMs: 600_000 })
  made.push(fromSnap.sandboxId)
  assert.equal(await fromSnap.files.read('/home/user/snap.txt'), 'in the snapshot')
  const listed = []
  for (const p = Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }); p.hasNext;) listed.push(...await p.nextItems())
  assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId))
  await fromSnap.kill()
  made.splice(made.indexOf(fromSnap.sandboxId), 1)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
})

test('fork', async () => {
  await sbx.files.write('/home/user/fork.txt', 'parent')
  const kids = await sbx.fork({ count: 1 })
  assert.equal(kids.length, 1)
  const kid = kids[0]
  assert.ok(!(kid instanceof Error), String(kid))
  made.push(kid.sandboxId)
  assert.notEqual(kid.sandboxId, sbx.sandboxId)
  assert.equal(await kid.files.read('/home/user/fork.txt'), 'parent')
  await kid.files.write('/home/user/fork.txt', 'child')
  assert.equal(await sbx.files.read('/home/user/fork.txt'), 'parent')
})

test('timeout expiry deletes the sandbox', async () => {
  const short = await Sandbox.create({ timeoutMs: 600_000 })
  made.push(short.sandboxId)
  // a stream in flight ends with the sandbox
  const bg = await short.commands.run('sleep 600', { background: true, timeoutMs: 0 })
  const ended = bg.wait().then(() => 'finished', (e) => e)
  await short.setTimeout(2000)
  await waitFor('the sandbox to expire', async () => {
    try {
      await Sandbox.getInfo(short.sandboxId)
      return false
    } catch (e) {
      if (e instanceof SandboxNotFoundError || e instanceof NotFoundError) return true
      throw e
    }
  })
  await assert.rejects(short.commands.run('true'), (e) => /not (found|running)|timeout|sandbox/i.test(String(e)))
  const how = await ended
  assert.ok(how instanceof Error, 'the background command\'s stream ended with an error, not ' + how)
})

test('network: allowPublicTraffic false needs the traffic token', async () => {
  const priv = await Sandbox.create({ timeoutMs: 600_000, network: { allowPublicTraffic: false }, metadata: { suite: 'js', run: RUN } })
  made.push(priv.sandboxId)
  assert.ok(priv.trafficAccessToken)
  await priv.commands.run('cd /tmp && echo private > index.html && python3 -m http.server 8000', { background: true, timeoutMs: 0 })
  const host = priv.getHost(8000)
  const token = { 'E2B-Traffic-Access-Token': priv.trafficAccessToken }
  await waitFor('the private server', async () => (await get(host, '/index.html', token)).body === 'private\n', 60_000)
  const anon = await get(host, '/index.html')
  assert.equal(anon.status, 403)
  assert.match(anon.body, /allowPublicTraffic/)
  const other = await get(host, '/index.html', { 'E2B-Traffic-Access-Token': sbx.trafficAccessToken }) // another sandbox's
  assert.equal(other.status, 403)
  assert.match(other.body, /secured with traffic access token/)
  assert.equal((await get(sbx.getHost(8000), '/index.html')).status, 200) // a public sandbox's port stays public
  assert.equal((await priv.commands.run('echo envd works')).stdout, 'envd works\n')
  await assert.rejects(Sandbox.create({ timeoutMs: 10_000, network: { allowOut: ['1.1.1.1'] } }), /allowOut/)
})

test('bad input', async () => {
  await assert.rejects(Sandbox.create('no-such-template-x', { timeoutMs: 10_000 }), /404|not found/i)
  await assert.rejects(Sandbox.connect('nosuchsandbox0000000'), SandboxNotFoundError)
  await assert.rejects(Sandbox.list({ apiKey: 'e2b_' + '0'.repeat(40) }).nextItems(), AuthenticationError)
  assert.ok(process.env.AGENTVM_SCOPED_KEY, 'a scoped key is given')
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId, { apiKey: process.env.AGENTVM_SCOPED_KEY }), (e) => e instanceof SandboxNotFoundError || e instanceof NotFoundError)
  const forged = new Sandbox({ sandboxId: sbx.sandboxId, envdVersion: '0.6.4', envdAccessToken: 'wrong', sandboxDomain: process.env.E2B_DOMAIN })
  await assert.rejects(forged.commands.run('true'), AuthenticationError)
  await assert.rejects(forged.files.read('/etc/hostname'), AuthenticationError)
  const host = `49983-${sbx.sandboxId}.${process.env.E2B_DOMAIN}`
  const bad = await get(host, '/health', { 'X-Access-Token': 'wrong' })
  assert.equal(bad.status, 401)
  const gone = await get(`49983-nosuchsandbox0000000.${process.env.E2B_DOMAIN}`, '/health')
  assert.equal(gone.status, 502)
  assert.match(gone.body, /The sandbox was not found/)
  assert.equal(await Sandbox.kill('nosuchsandbox0000000'), false)
})

test('kill', async () => {
  assert.equal(await sbx.kill(), true)
  made.splice(made.indexOf(sbx.sandboxId), 1)
  assert.equal(await Sandbox.kill(sbx.sandboxId), false)
})
