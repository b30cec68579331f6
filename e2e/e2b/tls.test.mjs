// The E2B SDK over HTTPS: serve --tls auto, the local CA trusted through
// NODE_EXTRA_CA_CERTS. First with envd reached at https://<proxy>
// (E2B_SANDBOX_URL), then as a deployment with wildcard DNS runs it: no
// E2B_SANDBOX_URL, every sandbox at https://<port>-<id>.<domain>, which is
// what signed file URLs need (they name no sandbox but by their host).
import './localhost-dns.mjs' // before the SDK: the wildcard DNS of a deployment
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox } from 'e2b'

test('create, run, files and kill over TLS', async () => {
  assert.match(process.env.E2B_SANDBOX_URL, /^https:/)
  const sbx = await Sandbox.create({ timeoutMs: 600_000 })
  try {
    assert.equal((await sbx.commands.run('echo tls')).stdout, 'tls\n')
    await sbx.files.write('/home/user/t.txt', 'over https')
    assert.equal(await sbx.files.read('/home/user/t.txt'), 'over https')
    assert.equal(await sbx.isRunning(), true)
    // A signed URL on the proxy's own address names no sandbox: refused.
    const bare = await sbx.downloadUrl('/home/user/t.txt')
    assert.ok(bare.startsWith(process.env.E2B_SANDBOX_URL + '/files?'), bare)
    assert.equal((await fetch(bare)).status, 404)
  } finally {
    assert.equal(await sbx.kill(), true)
  }
})

test('preview hosts over TLS: envd and signed file URLs', async () => {
  const viaProxy = process.env.E2B_SANDBOX_URL
  delete process.env.E2B_SANDBOX_URL
  try {
    const sbx = await Sandbox.create({ timeoutMs: 600_000 })
    try {
      assert.equal((await sbx.commands.run('echo host')).stdout, 'host\n')
      const up = await sbx.uploadUrl('/home/user/signed.txt')
      assert.match(up, new RegExp(`^https://49983-${sbx.sandboxId}\\.agentvm\\.localhost:\\d+/files\\?`))
      const form = new FormData()
      form.append('file', new Blob(['signed over tls']), 'signed.txt')
      assert.equal((await fetch(up, { method: 'POST', body: form })).status, 200)
      const down = await sbx.downloadUrl('/home/user/signed.txt')
      const got = await fetch(down)
      assert.equal(got.status, 200)
      assert.equal(await got.text(), 'signed over tls')
      assert.equal((await fetch(down.replace(/signature=[^&]+/, 'signature=v1_forged'))).status, 401)
      assert.equal((await fetch(down.replace(/signature=[^&]+&?/, ''))).status, 401)
    } finally {
      assert.equal(await sbx.kill(), true)
    }
  } finally {
    process.env.E2B_SANDBOX_URL = viaProxy
  }
})
