// Access: scoped tokens, ports and previews (through the preview proxy,
// public and private), TCP exposures and tunnels, custom domains, private
// networks and egress policies.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import * as http from 'node:http'
import * as net from 'node:net'
import { AgentVM, ConflictError, ForbiddenError, NotFoundError, UnauthorizedError } from '../dist/index.js'
import { av, cleanup, createVM, needsDaemon, readAll, uniq, until } from './helpers.mjs'

let web // serves /srv on :8000 (python3 -m http.server)
let peer
let health
before(async () => {
  if (needsDaemon) return
  health = await av.health()
  web = await createVM({ name: uniq('tsweb') })
  await web.files.write('/srv/index.html', 'hello from the preview\n', { mkdirs: true })
  const r = await web.exec('nohup python3 -m http.server 8000 --directory /srv >/tmp/web.log 2>&1 & for i in $(seq 600); do curl -sf -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; cat /tmp/web.log; exit 1')
  assert.equal(r.exit_code, 0, r.stdout + r.stderr)
})
after(() => cleanup(web, peer))

/** A request to the preview proxy with a Host header (no *.localhost resolution needed). */
function proxyGet(host, path = '/', headers = {}) {
  const [hostname, port] = health.proxy.split(':')
  return new Promise((resolve, reject) => {
    const req = http.get({ hostname, port: Number(port), path, headers: { ...headers, Host: host }, agent: false }, (res) => {
      let body = ''
      res.setEncoding('utf8')
      res.on('data', (c) => (body += c))
      res.on('end', () => resolve({ status: res.statusCode, body }))
    })
    req.on('error', reject)
    req.setTimeout(60_000, () => req.destroy(new Error('preview request timed out')))
  })
}

/** One HTTP/1.0 GET over a raw stream; resolves to the whole answer. */
async function rawGet(stream) {
  stream.write('GET / HTTP/1.0\r\nHost: x\r\n\r\n')
  return (await readAll(stream)).toString('utf8')
}

test('scoped tokens: what they open, listing, revoking', { skip: needsDaemon }, async () => {
  const tok = await av.tokens.create({ vm: web.name, allow: ['exec', 'files'], ttl: '10m', name: 'ts-sdk' })
  assert.match(tok.token, /^avt_/)
  assert.equal(tok.vm_id, web.id)
  assert.deepEqual(tok.allow, ['exec', 'files'])
  const scoped = new AgentVM({ url: av.url, token: tok.token })
  const mine = scoped.vm(web.name)
  assert.equal((await mine.exec('echo scoped')).stdout, 'scoped\n')
  assert.equal(await mine.files.readText('/srv/index.html'), 'hello from the preview\n')
  assert.equal((await mine.refresh()).id, web.id)
  await assert.rejects(scoped.vms.list(), (err) => err instanceof ForbiddenError && err.code === 'forbidden' && err.status === 403)
  await assert.rejects(mine.terminals.list(), ForbiddenError) // no term permission
  await assert.rejects(mine.suspend(), ForbiddenError) // lifecycle is the admin's
  assert.ok((await av.tokens.list({ vm: web.id })).some((t) => t.id === tok.id && !t.token))
  assert.ok((await av.tokens.list()).some((t) => t.id === tok.id))
  await av.tokens.revoke(tok.id)
  await assert.rejects(mine.exec('true'), (err) => err instanceof UnauthorizedError && err.status === 401)
  await assert.rejects(av.tokens.revoke(tok.id), NotFoundError)
  const info = await av.ssh()
  assert.equal(info.enabled, true)
  assert.match(info.listen, /:\d+$/)
  assert.match(info.host_key, /^ssh-ed25519 /)
})

test('ports and previews: private, public, TCP exposure, tunnel, domain', { skip: needsDaemon }, async () => {
  const host = `8000-${web.name}.${health.domain}`
  const priv = await web.ports.expose(8000)
  assert.equal(priv.kind, 'http')
  assert.equal(priv.public, undefined)
  assert.match(priv.url, new RegExp(`^https?://8000-${web.name}\\.`))
  assert.equal((await proxyGet(host)).status, 401)
  const tok = await av.tokens.create({ vm: web.id, allow: ['preview'] })
  const withTok = await proxyGet(host, '/', { Authorization: 'Bearer ' + tok.token })
  assert.equal(withTok.status, 200)
  assert.equal(withTok.body, 'hello from the preview\n')

  const pub = await web.ports.expose({ port: 8000, public: true })
  assert.equal(pub.public, true)
  assert.equal((await proxyGet(host)).body, 'hello from the preview\n')

  const tcp = await web.ports.expose({ port: 8000, tcp: true })
  assert.equal(tcp.kind, 'tcp')
  const [h, p] = tcp.host.split(':')
  const sock = net.connect(Number(p), h)
  await new Promise((r, j) => sock.once('connect', r).once('error', j))
  assert.match(await rawGet(sock), /200 OK[\s\S]*hello from the preview/)
  assert.deepEqual((await web.ports.list()).map((x) => `${x.port}/${x.kind}`).sort(), ['8000/http', '8000/tcp'])
  await web.ports.unexpose(8000, 'tcp')
  await web.ports.unexpose(8000)
  assert.deepEqual(await web.ports.list(), [])
  assert.equal((await proxyGet(host)).status, 401)

  // a raw TCP stream through the API: no port on the host at all
  const tunnel = await web.connect(8000)
  assert.match(await rawGet(tunnel), /hello from the preview/)

  const domain = `${uniq('app')}.example.test`
  const d = await av.domains.add({ domain, vm: web.name, port: 8000 })
  assert.equal(d.domain, domain)
  assert.ok((await av.domains.list()).some((x) => x.domain === domain))
  await web.ports.expose({ port: 8000, public: true })
  assert.equal((await proxyGet(domain)).body, 'hello from the preview\n')
  await av.domains.delete(domain)
  assert.ok(!(await av.domains.list()).some((x) => x.domain === domain))
  await web.ports.unexpose(8000)
  await av.tokens.revoke(tok.id)
})

test('private network: members talk by name; egress policies', { skip: needsDaemon, timeout: 300_000 }, async () => {
  const netName = uniq('tsnet')
  const n = await av.networks.create({ name: netName })
  assert.equal(n.name, netName)
  peer = await createVM({ name: uniq('tspeer'), network: netName })
  assert.equal(peer.info.network, netName)
  const w = await web.setNetwork(netName)
  assert.equal(w.network, netName)
  assert.deepEqual((await av.networks.get(netName)).vms?.sort(), [peer.name, web.name].sort())
  assert.ok((await av.networks.list()).some((x) => x.name === netName))
  const reach = async () => (await peer.exec(`curl -s -m 10 http://${web.name}:8000/`)).stdout
  await until('the peer to reach the web VM by name', async () => (await reach()) === 'hello from the preview\n')

  // a network-level deny keeps members talking to each other
  const denied = await av.networks.setEgress(netName, { mode: 'deny' })
  assert.equal(denied.egress.mode, 'deny')
  assert.equal(await reach(), 'hello from the preview\n')
  const allow = await av.networks.setEgress(netName, { mode: 'allow', allow: ['deb.debian.org', '203.0.113.0/24'] })
  assert.deepEqual(allow.egress.allow, ['deb.debian.org', '203.0.113.0/24'])

  // the VM's own policy
  const own = await peer.setEgress({ mode: 'deny' })
  assert.equal(own.egress.mode, 'deny')
  const cleared = await peer.setEgress(null)
  assert.equal(cleared.egress, undefined)

  await assert.rejects(av.networks.delete(netName), ConflictError) // VMs are on it
  const off = await web.setNetwork(null)
  assert.equal(off.network, undefined)
  await peer.delete()
  peer = undefined
  await av.networks.delete(netName)
  await assert.rejects(av.networks.get(netName), NotFoundError)
})
