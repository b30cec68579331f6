// Drives agentvm's MCP server with the official TypeScript client
// (@modelcontextprotocol/sdk, installed by e2e/mcp_test.go into a temp dir
// next to a copy of this file), over stdio (`agentvm mcp`) and over
// streamable HTTP (<API>/mcp). Environment: AGENTVM_BIN, AGENTVM_URL,
// AGENTVM_TOKEN (admin), AGENTVM_SCOPED_TOKEN and AGENTVM_SCOPED_VM (a token
// of one VM and that VM's name).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'

const env = process.env
const clients = []
after(async () => { for (const c of clients) await c.close().catch(() => {}) })

async function stdio(extra = {}) {
  const c = new Client({ name: 'agentvm-e2e', version: '1' })
  await c.connect(new StdioClientTransport({ command: env.AGENTVM_BIN, args: ['mcp'], env: { ...env, ...extra } }))
  clients.push(c)
  return c
}

async function http(token) {
  const c = new Client({ name: 'agentvm-e2e', version: '1' })
  await c.connect(new StreamableHTTPClientTransport(new URL(env.AGENTVM_URL + '/mcp'), { requestInit: { headers: { Authorization: 'Bearer ' + token } } }))
  clients.push(c)
  return c
}

// A create may cold-boot a template first (a minute and more under
// emulation on a fresh machine, longer while another test builds one):
// tool calls get ten minutes instead of the client's 60 s default.
const slow = { timeout: 600_000 }

const textOf = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n')

async function call(c, name, args) {
  const r = await c.callTool({ name, arguments: args }, undefined, slow)
  assert.ok(!r.isError, `${name} failed: ${textOf(r)}`)
  return textOf(r)
}

for (const [kind, connect] of [['stdio', () => stdio()], ['streamable HTTP', () => http(env.AGENTVM_TOKEN)]]) {
  test(`${kind}: tools, create, exec, files, fork, delete`, async () => {
    const c = await connect()
    const { tools } = await c.listTools()
    const names = tools.map((t) => t.name)
    for (const n of ['create_vm', 'list_vms', 'exec', 'read_file', 'write_file', 'list_files', 'fork_vm', 'snapshot_vm', 'suspend_vm', 'resume_vm', 'delete_vm', 'expose_port', 'create_service', 'service_logs', 'terminal_send', 'terminal_read', 'run_code']) {
      assert.ok(names.includes(n), `tool ${n} is listed`)
    }
    const del = tools.find((t) => t.name === 'delete_vm')
    assert.equal(del.annotations.destructiveHint, true)
    assert.ok(tools.every((t) => t.description && t.inputSchema?.type === 'object'))

    const vm = 'mcp-' + kind.replace(/\W/g, '').toLowerCase() + '-' + Date.now() % 100000
    assert.match(await call(c, 'create_vm', { name: vm }), new RegExp(`Created VM ${vm}`))
    const out = await call(c, 'exec', { vm, command: 'echo hi; echo err >&2; uname -s' })
    assert.match(out, /exit code: 0/)
    assert.match(out, /--- stdout ---\nhi\nLinux/)
    assert.match(out, /--- stderr ---\nerr/)
    const fail = await c.callTool({ name: 'exec', arguments: { vm, command: 'exit 3' } }, undefined, slow)
    assert.equal(fail.isError, true)
    assert.match(textOf(fail), /exit code: 3/)
    // long output: cut with a marker that says where the rest is
    const long = await call(c, 'exec', { vm, command: 'seq 1 20000' })
    const m = long.match(/The whole stdout is in (\S+) in the VM: read the rest with read_file \(path "[^"]+", offset (\d+)\)/)
    assert.ok(m, long.slice(-400))
    // page through the rest as the markers say
    const from = long.indexOf('--- stdout ---\n') + 15
    let all = long.slice(from, from + Number(m[2])) // what was shown: the first offset bytes (ASCII)
    for (let offset = Number(m[2]); offset >= 0;) {
      const page = await call(c, 'read_file', { vm, path: m[1], offset })
      const more = page.match(/\n\[\.\.\. \d+ more bytes: call read_file with offset (\d+) to continue/)
      all += more ? page.slice(0, more.index) : page
      offset = more ? Number(more[1]) : -1
    }
    const want = Array.from({ length: 20000 }, (_, i) => i + 1).join('\n') + '\n'
    assert.ok(all === want, `paged output: ${all.length} bytes, want ${want.length}`)

    assert.match(await call(c, 'write_file', { vm, path: '/root/notes/a.txt', content: 'hello from mcp\n' }), /Wrote 15 bytes/)
    assert.equal(await call(c, 'read_file', { vm, path: '/root/notes/a.txt' }), 'hello from mcp\n')
    assert.match(await call(c, 'list_files', { vm, path: '/root/notes' }), /a\.txt/)

    const forked = await call(c, 'fork_vm', { vm })
    const child = forked.match(/running copy: (\S+) /)[1]
    assert.equal(await call(c, 'read_file', { vm: child, path: '/root/notes/a.txt' }), 'hello from mcp\n')
    assert.match(await call(c, 'delete_vm', { vm: child }), /Deleted/)

    await call(c, 'terminal_send', { vm, input: 'echo $((6*7))\n' })
    let screen = ''
    for (let i = 0; i < 60 && !/42/.test(screen); i++) screen = await call(c, 'terminal_read', { vm })
    assert.match(screen, /42/)

    // bad arguments are tool errors a model can read, not protocol failures
    const bad = await c.callTool({ name: 'exec', arguments: { vm } }, undefined, slow)
    assert.equal(bad.isError, true)
    assert.match(textOf(bad), /command/)
    const missing = await c.callTool({ name: 'exec', arguments: { vm: 'no-such-vm-x', command: 'true' } }, undefined, slow)
    assert.equal(missing.isError, true)
    assert.match(textOf(missing), /no VM/)
    const wrongType = await c.callTool({ name: 'fork_vm', arguments: { vm, count: 'many' } }, undefined, slow)
    assert.equal(wrongType.isError, true)

    assert.match(await call(c, 'delete_vm', { vm }), /Deleted/)
  })
}

test('run_code: a code-interpreter VM, state, a chart as an image, an error, five languages', async () => {
  const c = await http(env.AGENTVM_TOKEN)
  const vm = 'mcp-code-' + Date.now() % 100000
  assert.match(await call(c, 'create_vm', { name: vm, image: 'code-interpreter' }), /run_code/)
  try {
    await call(c, 'run_code', { vm, code: 'total = 40' })
    assert.match(await call(c, 'run_code', { vm, code: 'print("sum"); total + 2' }), /--- stdout ---\nsum\n[\s\S]*--- value \(text\/plain\) ---\n42/)
    const chart = await c.callTool({ name: 'run_code', arguments: { vm, code: 'import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()' } }, undefined, slow)
    assert.ok(!chart.isError, textOf(chart))
    const img = chart.content.find((x) => x.type === 'image')
    assert.equal(img?.mimeType, 'image/png')
    assert.equal(Buffer.from(img.data, 'base64').subarray(1, 4).toString(), 'PNG')
    const err = await c.callTool({ name: 'run_code', arguments: { vm, code: 'raise KeyError("missing")' } }, undefined, slow)
    assert.equal(err.isError, true)
    assert.match(textOf(err), /KeyError/)
    const js = await call(c, 'run_code', { vm, code: '6 * 7', language: 'javascript' })
    assert.match(js, /42/)
    assert.match(await call(c, 'run_code', { vm, code: 'const t: number = 6 * 7; t', language: 'typescript' }), /--- value \(text\/plain\) ---\n42/)
    assert.match(await call(c, 'run_code', { vm, code: 'r <- 6 * 7; r', language: 'r' }), /--- result \(text\/plain\) ---\n\[1\] 42/)
    assert.match(await call(c, 'run_code', { vm, code: 'String s = "ja" + "va";\ns', language: 'java' }), /--- value \(text\/plain\) ---\njava\n/)
    const both = await c.callTool({ name: 'run_code', arguments: { vm, code: '1', language: 'python', context: 'x' } }, undefined, slow)
    assert.equal(both.isError, true)
  } finally {
    await call(c, 'delete_vm', { vm })
  }
})

test('a scoped token sees only its VM', async () => {
  for (const c of [await http(env.AGENTVM_SCOPED_TOKEN), await stdio({ AGENTVM_TOKEN: env.AGENTVM_SCOPED_TOKEN, AGENTVM_VM: env.AGENTVM_SCOPED_VM })]) {
    const names = (await c.listTools()).tools.map((t) => t.name)
    for (const n of ['create_vm', 'list_vms', 'delete_vm', 'fork_vm']) assert.ok(!names.includes(n), `${n} hidden`)
    assert.ok(names.includes('exec'))
    // vm defaults to the token's VM; another VM is refused
    assert.match(await call(c, 'exec', { command: 'hostname' }), new RegExp(env.AGENTVM_SCOPED_VM))
    const other = await c.callTool({ name: 'exec', arguments: { vm: 'not-mine', command: 'true' } }, undefined, slow)
    assert.equal(other.isError, true)
  }
})

test('a bad token is refused', async () => {
  await assert.rejects(http('avt_' + '0'.repeat(48)))
})
