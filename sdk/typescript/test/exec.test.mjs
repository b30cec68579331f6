// Exec: buffered, NDJSON events as produced, and the upgraded stream with
// stdin written while the command runs.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import { AgentVMError, InvalidArgumentError } from '../dist/index.js'
import { cleanup, createVM, needsDaemon, uniq, until } from './helpers.mjs'

let vm
before(async () => {
  if (!needsDaemon) vm = await createVM({ name: uniq('tsexec') })
})
after(() => cleanup(vm))

test('buffered: shell, argv, exit code, stderr, env, cwd, user, stdin', { skip: needsDaemon }, async () => {
  const r = await vm.exec('echo out; echo err >&2; exit 3')
  assert.equal(r.stdout, 'out\n')
  assert.equal(r.stderr, 'err\n')
  assert.equal(r.exit_code, 3)
  assert.equal(typeof r.duration_ms, 'number')
  assert.equal((await vm.exec(['printf', '%s|', 'a b', '$HOME'])).stdout, 'a b|$HOME|')
  const e = await vm.exec(['sh', '-c', 'echo $FOO; pwd; id -un'], { env: { FOO: 'bar' }, cwd: '/tmp', user: 'agent' })
  assert.equal(e.stdout, 'bar\n/tmp\nagent\n')
  assert.equal((await vm.exec(['tr', 'a-z', 'A-Z'], { stdin: 'shout\n' })).stdout, 'SHOUT\n')
  assert.equal((await vm.exec({ cmd: ['echo', 'request form'] })).stdout, 'request form\n')
})

test('buffered: timeout, signals, a missing command, bad requests', { skip: needsDaemon }, async () => {
  const t = await vm.exec('sleep 600', { timeout: '1s' })
  assert.equal(t.timed_out, true)
  assert.ok(t.signal, JSON.stringify(t))
  const k = await vm.exec('kill -TERM $$')
  assert.equal(k.signal, 'SIGTERM')
  const m = await vm.exec(['no-such-command-here'])
  assert.notEqual(m.exit_code, 0)
  assert.match(m.stderr, /no-such-command-here/)
  await assert.rejects(vm.exec(['true'], { cwd: 'relative' }), InvalidArgumentError)
  await assert.rejects(vm.exec([]), (err) => err instanceof AgentVMError && err.status === 400)
})

test('buffered: an aborted call ends', { skip: needsDaemon }, async () => {
  const ac = new AbortController()
  const p = vm.exec('sleep 600', { signal: ac.signal })
  setTimeout(() => ac.abort(), 300)
  await assert.rejects(p, (err) => err.name === 'AbortError')
})

test('events arrive as they are produced, binary output as base64', { skip: needsDaemon }, async () => {
  // The command goes on only once the test has received "one" (and made the
  // file it waits for): without streaming it would wait in vain.
  await vm.exec('rm -f /tmp/ts-stream-go')
  const seen = []
  const cmd = 'echo one; i=0; until [ -e /tmp/ts-stream-go ] || [ $i -ge 600 ]; do sleep 0.1; i=$((i+1)); done; ' +
    '[ -e /tmp/ts-stream-go ] && echo two >&2; exit 4'
  for await (const ev of vm.execStream(cmd)) {
    seen.push(ev)
    if (ev.type === 'stdout') await vm.exec('touch /tmp/ts-stream-go')
  }
  assert.deepEqual(seen.map((e) => e.type), ['stdout', 'stderr', 'exit'])
  assert.equal(seen[0].data, 'one\n')
  assert.equal(seen[1].data, 'two\n')
  assert.equal(seen[2].exit_code, 4)
  const bin = []
  for await (const ev of vm.execStream(['printf', '\\377\\000\\376'])) bin.push(ev)
  assert.equal(bin[0].type, 'stdout_base64')
  assert.deepEqual([...Buffer.from(bin[0].data, 'base64')], [0xff, 0, 0xfe])
  const withStdin = []
  for await (const ev of vm.execStream(['cat'], { stdin: 'piped' })) withStdin.push(ev)
  assert.equal(withStdin[0].data, 'piped')
})

test('streaming exec with stdin: a conversation with a running process', { skip: needsDaemon }, async () => {
  const p = await vm.spawn(['sh', '-c', 'while read l; do echo "out:$l"; echo "err:$l" >&2; done; echo bye; exit 7'])
  let out = ''
  let err = ''
  p.stdout.on('data', (c) => (out += c))
  p.stderr.on('data', (c) => (err += c))
  // Each line is answered while stdin is still open.
  for (const word of ['alpha', 'beta', 'gamma']) {
    await p.write(word + '\n')
    await until(`the answer to ${word}`, () => out.includes(`out:${word}\n`) && err.includes(`err:${word}\n`), { timeout: 60_000, interval: 20 })
  }
  assert.equal(p.exitStatus, undefined)
  await p.end()
  const st = await p.wait()
  assert.equal(st.exit_code, 7)
  assert.equal(out, 'out:alpha\nout:beta\nout:gamma\nbye\n')
  assert.equal(err, 'err:alpha\nerr:beta\nerr:gamma\n')
})

test('streaming exec: big input, binary output, run()', { skip: needsDaemon }, async () => {
  const data = randomBytes(3 << 20)
  const want = createHash('sha256').update(data).digest('hex')
  // stdin from an async iterable, in uneven pieces
  async function* pieces() {
    for (let off = 0; off < data.length; off += 100_000) yield data.subarray(off, off + 100_000)
  }
  const chunks = []
  const r = await vm.run('sha256sum | cut -d" " -f1', { stdin: pieces(), onStdout: (c) => chunks.push(c) })
  assert.equal(r.exit_code, 0)
  assert.equal(r.stdout.trim(), want)
  assert.equal(Buffer.concat(chunks).toString().trim(), want)
  const p = await vm.spawn(['head', '-c', '1000000', '/dev/zero'], { stdin: '' })
  let n = 0
  for await (const c of p.stdout) n += c.length
  assert.equal(n, 1_000_000)
  assert.equal((await p.wait()).exit_code, 0)
  const missing = await vm.run(['no-such-command-here'])
  assert.notEqual(missing.exit_code, 0)
  assert.match(missing.stderr, /no-such-command-here/)
})

test('streaming exec: signals, and closing kills the command', { skip: needsDaemon }, async () => {
  const p = await vm.spawn('echo started; exec sleep 600')
  let out = ''
  p.stdout.on('data', (c) => (out += c))
  await until('the command to start', () => out.includes('started'), { timeout: 60_000, interval: 20 })
  await p.signal('TERM')
  const st = await p.wait()
  assert.equal(st.signal, 'SIGTERM')

  const q = await vm.spawn(['sh', '-c', 'echo $$ > /tmp/ts-killed.pid; exec sleep 600'])
  await until('the pid file', async () => (await vm.exec('cat /tmp/ts-killed.pid')).stdout.trim() !== '', { timeout: 60_000 })
  q.kill()
  await assert.rejects(q.wait(), (err) => err instanceof AgentVMError && err.code === 'stream_lost')
  await until('the killed command to be gone', async () => (await vm.exec('kill -0 $(cat /tmp/ts-killed.pid)')).exit_code !== 0, { timeout: 60_000 })
})
