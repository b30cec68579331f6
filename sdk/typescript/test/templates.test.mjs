// Templates: a build from a tar of a context with the progress streamed, a
// VM made from the template with its service already answering, a failing
// step as a BuildError, list, get, tags, delete.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { BuildError, NotFoundError } from '../dist/index.js'
import { av, cleanup, needsDaemon, uniq } from './helpers.mjs'

const name = uniq('tstpl')
const made = []
after(async () => {
  await cleanup(...made)
  if (!needsDaemon) await av.templates.delete(name).catch(() => {})
})

// A tar of a directory, made with the system's tar (the SDK takes any tar).
function tarOf(files) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'tstpl-'))
  for (const [f, body] of Object.entries(files)) {
    fs.mkdirSync(path.dirname(path.join(dir, f)), { recursive: true })
    fs.writeFileSync(path.join(dir, f), body)
  }
  return execFileSync('tar', ['-c', '-C', dir, '.'])
}

test('build, create from it, list, get, delete', { skip: needsDaemon, timeout: 900_000 }, async () => {
  const ctx = tarOf({
    Dockerfile: 'FROM default\nARG GREETING\nCOPY site/ /srv/site/\nRUN echo "built $GREETING" > /srv/site/built.txt\nEXPOSE 8000\nCMD ["python3", "-m", "http.server", "8000", "--directory", "/srv/site"]\n',
    'site/index.html': '<p>ts sdk</p>\n',
  })
  const events = []
  const t = await av.templates.build(name, ctx, { memory: '512M', buildArgs: { GREETING: 'by the sdk' }, timeout: '30m', onEvent: (e) => events.push(e) })
  assert.equal(t.name, name)
  assert.deepEqual(t.start, ['python3', '-m', 'http.server', '8000', '--directory', '/srv/site'])
  assert.deepEqual(t.expose, [8000])
  assert.ok(events.some((e) => e.instruction === 'COPY site/ /srv/site/' && e.step === 2 && e.of === 4), JSON.stringify(events))
  assert.ok(events.some((e) => e.log?.includes('ready')), JSON.stringify(events))

  const vm = await av.vms.create({ template: name })
  made.push(vm)
  const r = await vm.exec('curl -sS --max-time 10 http://127.0.0.1:8000/index.html; cat /srv/site/built.txt')
  assert.equal(r.stdout, '<p>ts sdk</p>\nbuilt by the sdk\n')

  assert.ok((await av.templates.list()).some((x) => x.name === name))
  const full = await av.templates.get(name)
  assert.match(full.dockerfile, /^FROM default/)
  assert.match(full.build_log, /\[4\/4\] start python3/)

  // Tags: the same build again (every step cached) as name:v2 with v3, then v1 on it.
  await av.templates.build(`${name}:v2`, ctx, { memory: '512M', buildArgs: { GREETING: 'by the sdk' }, tags: ['v3'] })
  assert.equal((await av.templates.tag(`${name}:v2`, ['v1'])).name, `${name}:v2`)
  for (const tag of ['v1', 'v2', 'v3']) {
    assert.equal((await av.templates.get(`${name}:${tag}`)).snapshot, full.snapshot, tag)
    await av.templates.delete(`${name}:${tag}`)
  }
  await assert.rejects(av.templates.get(`${name}:v1`), NotFoundError)

  await assert.rejects(
    av.templates.build(uniq('tsbad'), tarOf({ Dockerfile: 'FROM default\nRUN echo ok > /tmp/ok\nRUN echo failing now; exit 4\n' }), { memory: '512M' }),
    (e) => e instanceof BuildError && e.exitCode === 4 && e.step === 3 && e.line === 3 && e.output.includes('failing now'),
  )
  await assert.rejects(av.templates.build(uniq('tsbad'), tarOf({ Dockerfile: 'FROM default\nVOLUME /x\n' })), (e) => e.status === 400 && /line 2: VOLUME/.test(e.message))

  // The failed build's first step stays cached until a prune (a delete prunes too).
  assert.ok((await av.templates.prune()) >= 1, 'prune removed nothing')
  assert.ok((await av.templates.list()).some((x) => x.name === name), 'prune left the template')
  await av.templates.delete(name)
  await assert.rejects(av.templates.get(name), NotFoundError)
})
