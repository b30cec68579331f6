// Drives agentvm's code-interpreter image through the unmodified
// `@e2b/code-interpreter` npm package (installed by e2e/e2b_test.go into a
// temp dir next to a copy of this file), with the environment of
// sdk.test.mjs.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

const made = []
let sbx

after(async () => {
  for (const s of made) await s.kill().catch(() => {})
})

test('create with the default template (code-interpreter-v1)', async () => {
  sbx = await Sandbox.create({ timeoutMs: 1_800_000, envs: { SANDBOX_WIDE: 'from-create' } })
  made.push(sbx)
  const info = await sbx.getInfo()
  assert.equal(info.templateId, 'code-interpreter-v1')
})

test('state persists; results, logs and callbacks', async () => {
  await sbx.runCode('x = 41')
  const ex = await sbx.runCode('x + 1')
  assert.equal(ex.text, '42')
  assert.ok(ex.executionCount >= 2, `execution count ${ex.executionCount}`)

  const seen = { stdout: [], stderr: [], results: [] }
  const r = await sbx.runCode('import sys\nprint("to out")\nprint("to err", file=sys.stderr)\n"last"', {
    onStdout: (m) => seen.stdout.push(m.line),
    onStderr: (m) => seen.stderr.push(m.line),
    onResult: (res) => seen.results.push(res),
  })
  assert.deepEqual(r.logs.stdout, ['to out\n'])
  assert.deepEqual(r.logs.stderr, ['to err\n'])
  assert.deepEqual(seen.stdout, ['to out\n'])
  assert.deepEqual(seen.stderr, ['to err\n'])
  assert.equal(seen.results.length, 1)
  assert.equal(seen.results[0].text, 'last')
  assert.equal(r.results[0].isMainResult, true)
})

test('errors carry name, value and traceback', async () => {
  let cbErr
  const r = await sbx.runCode('def f():\n    raise ValueError("bad value")\nf()', { onError: (e) => { cbErr = e } })
  assert.equal(r.error.name, 'ValueError')
  assert.equal(r.error.value, 'bad value')
  assert.match(r.error.traceback, /raise ValueError/)
  assert.equal(cbErr.name, 'ValueError')
})

test('a chart comes back as a PNG; a DataFrame as HTML', async () => {
  const r = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [2, 4, 1])\nplt.title("line")\nplt.show()')
  const png = r.results.find((x) => x.png)
  assert.ok(png, 'no png result: ' + JSON.stringify(r.results.map((x) => Object.keys(x.raw))))
  const buf = Buffer.from(png.png, 'base64')
  assert.equal(buf.subarray(1, 4).toString(), 'PNG')
  const df = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": [3, 4]})')
  assert.match(df.results[0].html, /<table/)
})

test('env vars: the sandbox\'s, per run, and per run overriding', async () => {
  const a = await sbx.runCode('import os; os.getenv("SANDBOX_WIDE")')
  assert.equal(a.text, 'from-create')
  const b = await sbx.runCode('import os; os.getenv("FOO")', { envs: { FOO: 'bar' } })
  assert.equal(b.text, 'bar')
  const c = await sbx.runCode('import os; os.getenv("FOO", "default")')
  assert.equal(c.text, 'default')
  const d = await sbx.runCode('import os; os.getenv("SANDBOX_WIDE")', { envs: { SANDBOX_WIDE: 'overwrite' } })
  assert.equal(d.text, 'overwrite')
})

test('cwd and languages', async () => {
  const py = await sbx.runCode('from pathlib import Path; print(Path.cwd())', { language: 'python' })
  assert.equal(py.logs.stdout.join('').trim(), '/home/user')
  const js = await sbx.runCode('process.cwd()', { language: 'js' })
  assert.equal(js.text, '/home/user')
  await sbx.runCode('const counter = 3', { language: 'javascript' })
  const js2 = await sbx.runCode('counter * 2', { language: 'javascript' })
  assert.equal(js2.text, '6')
  const sh = await sbx.runCode('pwd', { language: 'bash' })
  assert.equal(sh.logs.stdout.join('').trim(), '/home/user')
  const shEnv = await sbx.runCode('echo $FOO', { language: 'bash', envs: { FOO: 'bash-env' } })
  assert.equal(shEnv.logs.stdout.join('').trim(), 'bash-env')
})

test('R, Java and TypeScript: values, the sandbox\'s env and a run\'s, cwd', async () => {
  const r = await sbx.runCode('Sys.getenv("SANDBOX_WIDE")', { language: 'r' })
  assert.equal(r.results[0]?.text.trim(), '[1] "from-create"')
  const rEnv = await sbx.runCode('Sys.getenv("FOO")', { language: 'r', envs: { FOO: 'bar' } })
  assert.equal(rEnv.results[0]?.text.trim(), '[1] "bar"')
  const rCwd = await sbx.runCode('getwd()', { language: 'r' })
  assert.equal(rCwd.results[0]?.text.trim(), '[1] "/home/user"')
  const plot = await sbx.runCode('plot(1:10)', { language: 'r' })
  assert.equal(Buffer.from(plot.results[0]?.png ?? '', 'base64').subarray(1, 4).toString(), 'PNG')
  const j = await sbx.runCode('System.getProperty("SANDBOX_WIDE")', { language: 'java' })
  assert.equal(j.results[0]?.text.trim(), 'from-create')
  const jEnv = await sbx.runCode('System.getProperty("FOO")', { language: 'java', envs: { FOO: 'bar' } })
  assert.equal(jEnv.text, 'bar')
  const jDefault = await sbx.runCode('System.getProperty("FOO", "default")', { language: 'java' })
  assert.equal(jDefault.text, 'default')
  const ts = await sbx.runCode('const message: string = "Hello World!"; console.log(message)', { language: 'ts' })
  assert.deepEqual(ts.logs.stdout, ['Hello World!\n'])
})

test('contexts: create, use, list, restart, remove', async () => {
  const ctx = await sbx.createCodeContext({ cwd: '/tmp', language: 'python' })
  assert.equal(ctx.cwd, '/tmp')
  const r = await sbx.runCode('import os; mine = 5; os.getcwd()', { context: ctx })
  assert.equal(r.text, '/tmp')
  const list = await sbx.listCodeContexts()
  assert.ok(list.some((c) => c.id === ctx.id))
  assert.ok(list.some((c) => c.language === 'python'))
  await sbx.restartCodeContext(ctx)
  const after = await sbx.runCode('mine', { context: ctx })
  assert.equal(after.error?.name, 'NameError')
  await sbx.removeCodeContext(ctx.id)
  const list2 = await sbx.listCodeContexts()
  assert.ok(!list2.some((c) => c.id === ctx.id))
  await assert.rejects(sbx.runCode('1', { context: ctx }), /not found/i)
})

test('running code needs the envd access token; the SDK sends it', async () => {
  const url = `http://${process.env.AGENTVM_PROXY}/execute`
  const headers = { 'Content-Type': 'application/json', 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49999' }
  const res = await fetch(url, { method: 'POST', headers, body: JSON.stringify({ code: '1' }) })
  assert.equal(res.status, 401)
  const ok = await fetch(url, { method: 'POST', headers: { ...headers, 'X-Access-Token': 'wrong' }, body: JSON.stringify({ code: '1' }) })
  assert.equal(ok.status, 401)
})

test('a client timeout interrupts the kernel; the next run works', async () => {
  await assert.rejects(sbx.runCode('import time; time.sleep(600)', { timeoutMs: 5_000 }))
  // The server interrupts the kernel once it sees the client gone; wait on
  // that condition with a generous deadline.
  const end = Date.now() + 120_000
  for (;;) {
    try {
      const r = await sbx.runCode('1 + 1', { timeoutMs: 20_000 })
      assert.equal(r.text, '2')
      break
    } catch (e) {
      if (Date.now() > end) throw e
    }
  }
  const x = await sbx.runCode('x')
  assert.equal(x.text, '41')
})

test('a killed sandbox gives an error, not a hang', async () => {
  const other = await Sandbox.create({ timeoutMs: 600_000 })
  made.push(other)
  let started
  const running = new Promise((r) => { started = r })
  const run = other.runCode('import time\nprint("started", flush=True)\ntime.sleep(600)', { timeoutMs: 600_000, onStdout: () => started() })
  const failed = assert.rejects(run, /killed/) // handled before the kill rejects it
  await running
  await other.kill()
  await failed
})
