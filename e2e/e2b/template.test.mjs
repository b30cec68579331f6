// E2B's Template SDK (the published e2b npm package) against agentvm:
// Template.build with steps and files, a sandbox of the template whose
// start command already serves, the cache on a rebuild, a failing step,
// buildInBackground with getBuildStatus, exists, fromDockerfile, tags.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { Template, Sandbox, waitForPort, waitForFile } from 'e2b'

const run = (process.env.RUN || 'run').replace(/[^a-z0-9-]/g, '-').slice(-30)
const name = `tpl-js-${run}`
const ctx = fs.mkdtempSync(path.join(os.tmpdir(), 'e2b-template-'))
fs.mkdirSync(path.join(ctx, 'site', 'sub'), { recursive: true })
fs.writeFileSync(path.join(ctx, 'site', 'index.html'), '<h1>built by the E2B SDK</h1>\n')
fs.writeFileSync(path.join(ctx, 'site', 'sub', 'b.txt'), 'b\n')
fs.writeFileSync(path.join(ctx, 'tool.sh'), '#!/bin/sh\necho tool ran\n')

const template = () =>
  Template({ fileContextPath: ctx })
    .fromTemplate('base')
    .aptInstall(['ripgrep'], { noInstallRecommends: true })
    .copy('site', '/srv/site')
    .copy('tool.sh', '/usr/local/bin/tool', { user: 'root', mode: 0o755 })
    .setEnvs({ GREETING: 'hello from ENV' })
    .runCmd('echo "$GREETING" > /srv/site/greeting.txt')
    .setWorkdir('/srv/site')
    .setStartCmd('python3 -m http.server 8000', waitForPort(8000))

test('Template.build, then a sandbox whose start command already serves', async () => {
  const logs = []
  const info = await Template.build(template(), name, { onBuildLogs: (e) => logs.push(e.message) })
  assert.equal(info.name ?? name, name)
  assert.ok(logs.some((l) => l.includes('Template created with ID')), logs.join('\n'))
  assert.ok(await Template.exists(name), 'exists after the build')
  assert.equal(await Template.exists(`no-such-${run}`), false)

  const sbx = await Sandbox.create(name)
  try {
    const r = await sbx.commands.run('curl -sS --max-time 10 http://127.0.0.1:8000/index.html')
    assert.equal(r.stdout, '<h1>built by the E2B SDK</h1>\n')
    const f = await sbx.commands.run(
      'cat /srv/site/greeting.txt /srv/site/sub/b.txt; tool; rg --version | head -1 | cut -d" " -f1; stat -c "%U %a" /srv/site/index.html /usr/local/bin/tool; echo "$GREETING"'
    )
    assert.equal(f.stdout, 'hello from ENV\nb\ntool ran\nripgrep\nuser 644\nroot 755\nhello from ENV\n')
  } finally {
    await sbx.kill()
  }
})

test('a rebuild comes from the cache; a failing step fails the build', async () => {
  const logs = []
  await Template.build(template(), name, { onBuildLogs: (e) => logs.push(e.message) })
  // FROM, the 5 steps that change the machine (apt, 2 copies, the RUN, the WORKDIR's chown) and the start
  assert.equal(logs.filter((l) => l.includes('(cached)')).length, 7, logs.join('\n'))

  const bad = Template().fromTemplate(name).runCmd('echo about to fail; exit 3')
  await assert.rejects(Template.build(bad, `${name}-bad`), (e) => {
    assert.match(e.message, /exited with code 3/)
    return true
  })
  assert.equal(await Template.exists(`${name}-bad`), false)
})

test('tags: a build with tags, assignTags, getTags, a sandbox of a tag, removeTags', async () => {
  // The cached build again, tagged v1 and v2.
  await Template.build(template(), `${name}:v1`, { tags: ['v2'] })
  assert.ok(await Template.exists(`${name}:v1`), 'exists name:v1')
  assert.ok(await Template.exists(`${name}:default`), 'name:default is the name')
  const info = await Template.assignTags(`${name}:v1`, ['stable'])
  assert.deepEqual(info.tags, ['stable'])
  assert.match(info.buildId, /^[0-9a-f-]{36}$/)
  const tags = await Template.getTags(name)
  assert.deepEqual(tags.map((t) => t.tag).sort(), ['default', 'stable', 'v1', 'v2'])
  assert.equal(new Set(tags.map((t) => t.buildId)).size, 1, 'every tag is on the one build')
  const sbx = await Sandbox.create(`${name}:stable`)
  try {
    const r = await sbx.commands.run('curl -sS --max-time 10 http://127.0.0.1:8000/index.html')
    assert.equal(r.stdout, '<h1>built by the E2B SDK</h1>\n')
  } finally {
    await sbx.kill()
  }
  await Template.removeTags(name, ['stable', 'v1', 'v2'])
  assert.equal(await Template.exists(`${name}:stable`), false)
  assert.ok(await Template.exists(name), 'removing tags keeps the template')
  await assert.rejects(Template.assignTags(`${name}:nope`, ['x']), /not found|no template/i)
})

test('fromImage: a Debian image from a registry, with a login', { skip: !process.env.AGENTVM_TEST_REGISTRY }, async () => {
  const ref = `${process.env.AGENTVM_TEST_REGISTRY}/team/debian:bookworm`
  await assert.rejects(Template.build(Template().fromImage(ref).runCmd('true'), `${name}-img-nologin`), /refused/)
  const t = Template()
    .fromImage(ref, { username: 'ci', password: 's3cret' })
    .runCmd('echo "$(whoami) in $(pwd)" > /tmp/who.txt')
  await Template.build(t, `${name}-img`)
  const sbx = await Sandbox.create(`${name}-img`)
  try {
    const r = await sbx.commands.run('cat /tmp/who.txt /etc/debian_version; ps -p 1 -o comm=')
    assert.match(r.stdout, /^user in \/home\/user\n12\.\d+\nsystemd\n$/)
  } finally {
    await sbx.kill()
  }
})

test('buildInBackground and getBuildStatus; fromDockerfile', async () => {
  const t = Template({ fileContextPath: ctx }).fromDockerfile(
    'FROM e2bdev/base\nCOPY tool.sh /opt/tool.sh\nRUN touch /tmp/ready-file\nCMD ["sleep", "infinity"]\n'
  ).setReadyCmd(waitForFile('/tmp/ready-file'))
  const info = await Template.buildInBackground(t, `${name}-bg`)
  let status
  for (let i = 0; i < 900; i++) {
    status = await Template.getBuildStatus(info)
    if (status.status === 'ready' || status.status === 'error') break
    await new Promise((r) => setTimeout(r, 500))
  }
  assert.equal(status.status, 'ready', JSON.stringify(status.reason))
  const sbx = await Sandbox.create(`${name}-bg`)
  try {
    const r = await sbx.commands.run('cat /opt/tool.sh; pgrep -x sleep >/dev/null && echo sleeping')
    assert.equal(r.stdout, '#!/bin/sh\necho tool ran\nsleeping\n')
  } finally {
    await sbx.kill()
  }
})
