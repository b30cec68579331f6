// The E2B SDK over HTTPS: serve --tls auto, the local CA trusted through
// NODE_EXTRA_CA_CERTS, envd reached at https://<proxy>.
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
  } finally {
    assert.equal(await sbx.kill(), true)
  }
})
